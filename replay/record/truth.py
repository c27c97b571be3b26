"""The KV ground truth: how many leading positions of each request's KV cache hold its true tokens.

Where it sits: workloads -> models -> impls -> **record** -> engines -> check. An observer of
the reference runner (attached with the worker observer, record/worker_observer.py): it follows
the requests the worker knows, which positions each step writes and with which token ids, and
compares them with the oracle's true sequence. It writes the truth_* columns:

    truth_num_computed_tokens   valid leading positions before the step's write
    truth_kv_after              valid leading positions after it
    truth_kv_ok                 no gap, no overwrite with a wrong token, no write outside the blocks

A write that starts past the valid prefix leaves a gap; one that starts before it rewrites
positions; a wrong token ends the valid prefix where it landed. A request the worker knows but
did not run this step gets its standing values. A live engine has no oracle and no truth.
"""

from __future__ import annotations

from typing import Any

from specreplay.replay.record.worker_observer import RowWriter, RunnerObserver


class KvTruth(RunnerObserver):
    def __init__(self, oracle: Any, writer: RowWriter, block_size: int) -> None:
        self.oracle = oracle
        self.writer = writer
        self.block_size = block_size
        self.valid: dict[str, int] = {}  # request -> valid leading positions
        self.ok: dict[str, bool] = {}
        self.step: int | None = None
        self.before: dict[str, int] = {}
        self.inputs: Any = None

    def on_execute(self, runner: Any, so: Any) -> None:
        self.step = getattr(so, "_specreplay_step", None)
        self.inputs = None

    def on_states(self, runner: Any, so: Any) -> None:
        """What _update_states did to the worker's knowledge of each request's KV."""
        for rid in so.finished_req_ids:
            self.valid.pop(rid, None)
            self.ok.pop(rid, None)
        for data in so.scheduled_new_reqs:
            rid = data.req_id
            if rid in self.valid:  # a streaming session's next turn keeps what was computed
                self.valid[rid] = min(self.valid[rid], data.num_computed_tokens)
            else:
                self.valid[rid] = data.num_computed_tokens
                self.ok[rid] = True
        for rid in so.scheduled_cached_reqs.resumed_req_ids:
            self.valid[rid] = 0  # its old blocks were freed at preemption: nothing valid remains
        self.before = dict(self.valid)

    def on_inputs(self, rows: list, runner: Any, so: Any, inputs: Any) -> None:
        """A position outside the request's blocks has no KV slot: the write is broken."""
        self.inputs = inputs
        bs = self.block_size
        for x, rid in enumerate(inputs.rows):
            blocks = runner.input_batch.block_table[x]
            start, n = inputs.starts[x], inputs.num_scheduled[x]
            if not (0 <= start // bs and (start + n - 1) // bs < len(blocks)):
                self.ok[rid] = False

    def on_sampled(self, runner: Any, output: Any = None) -> None:
        inputs = self.inputs
        host = inputs.input_ids.tolist()  # after the clamp: what the model really read
        counts = runner.valid_sampled_token_count_cpu
        begin = 0
        for x, rid in enumerate(inputs.rows):
            n, d, start = inputs.num_scheduled[x], inputs.num_drafts[x], inputs.starts[x]
            discarded = inputs.discarded[x]
            kept = n if discarded else n - d + counts[x] - 1  # positions whose KV stays valid
            expected = self.oracle.expected(rid, len(runner.requests[rid].prompt_token_ids))
            written = host[begin : begin + kept]
            begin = inputs.cu[x]
            before = self.valid.get(rid, 0)
            good = 0
            while good < kept and start + good < len(expected) and written[good] == expected[start + good]:
                good += 1
            if start > before:
                self.ok[rid] = False  # positions before..start-1 were never written
                after = before
            elif good < kept:
                self.ok[rid] = False
                after = min(before, start + good) if start + good < before else start + good
            else:
                after = max(before, start + kept)
            self.valid[rid] = after

    def flush(self) -> None:
        if self.step is None:
            return
        ran = set(self.inputs.rows) if self.inputs is not None else set()
        for rid, valid in self.valid.items():
            before = self.before.get(rid, valid) if rid in ran else valid
            self.writer.write(
                self.step,
                rid,
                {"truth_num_computed_tokens": before, "truth_kv_after": valid, "truth_kv_ok": self.ok.get(rid, True)},
            )
        self.writer.step_done(self.step)
        self.inputs = None
