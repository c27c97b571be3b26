"""The vLLM and SGLang failures specreplay knows, each as the smallest workload that shows it.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. The bug matrix (workflows/bug_matrix.py, `specreplay scenarios --matrix`)
runs each of these on every modelled vLLM release and on SGLang 0.5.23's real scheduler and says
which reproduce; the differential tests run the same workloads on the real schedulers. A bug
"reproduces" when the checker reports `code` (at `step`, when given) and, for a crash, the
engine's message names one of `asserts` (the reference's or vLLM's own wording of the same
assert). An SGLang failure (`engine` "sglang-scheduler") may name `pre_fix`, an implementation that puts
back the code before SGLang's fix: 0.5.23 has it `fixed` when that one reproduces and upstream
does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from specreplay.replay.workloads.workload import Workload

#: The engine config of most hand-written workloads: async, k = 3, room for everything.
ROOMY_ASYNC = {
    "max_num_batched_tokens": 64,
    "max_num_seqs": 16,
    "num_spec_tokens": 3,
    "async_scheduling": True,
    "block_size": 16,
    "num_blocks": 1000,
    "max_model_len": 512,
}


def resubmit_then_reset() -> Workload:
    """A resubmission gets its previous life's output: the new life's in-flight count goes 4
    tokens short, a later cache reset copies it into the stale count, and draining it asserts.
    Found by a randomized differential run (seed 22796), shrunk."""
    return Workload.from_dict(
        {
            "name": "resubmit-then-reset",
            "seed": 22796,
            "acceptance": "random:0.3",
            "config": {
                **ROOMY_ASYNC,
                "max_num_batched_tokens": 12,
                "max_num_seqs": 12,
                "num_blocks": 9,
                "max_model_len": 256,
            },
            "requests": [
                {"id": "0", "arrival_step": 3, "prompt_len": 84, "max_tokens": 7, "stop_at": 5, "acceptance": "none"},
                {"id": "1", "prompt_len": 10, "max_tokens": 5, "stop_at": 4},
                {"id": "2", "prompt_len": 4, "max_tokens": 39, "abort_step": 13, "acceptance": "none"},
                {"id": "3", "prompt_len": 2, "max_tokens": 21, "stop_at": 20, "acceptance": "none"},
            ],
            "events": [
                {"step": 12, "kind": "abort", "request": "0"},
                {"step": 12, "kind": "resubmit", "request": "0"},
                {"step": 12, "kind": "reset_prefix_cache", "reset_running": True},
                {"step": 20, "kind": "reset_prefix_cache", "reset_running": True},
            ],
        }
    )


def resubmit_onto_waiting_life() -> Workload:
    """Request 7 is resubmitted under its id at step 30 while its first life's last step is in
    flight; the new life is still waiting (no placeholders), so vLLM 0.33.0, which resolves
    placeholders only while there are some, takes the old life's 4 tokens onto the new life
    without an assert: the client of the new life gets tokens it never asked for. (0.32.0
    asserts here: the `resubmit` row.) Found by the 0.33.0 differential (random seed 28), shrunk."""
    return Workload.from_dict(
        {
            "name": "resubmit-onto-waiting",
            "seed": 28,
            "acceptance": "random:0.7",
            "config": {
                **ROOMY_ASYNC,
                "max_num_batched_tokens": 16,
                "max_num_seqs": 4,
                "block_size": 4,
                "num_blocks": 109,
                "max_model_len": 256,
            },
            "requests": [
                {"id": "0", "prompt_len": 10, "max_tokens": 3},
                {"id": "1", "prompt_len": 11, "max_tokens": 24},
                {"id": "2", "prompt_len": 86, "max_tokens": 18},
                {"id": "3", "prompt_len": 2, "max_tokens": 34},
                {"id": "4", "prompt_len": 1, "max_tokens": 15, "acceptance": "none"},
                {"id": "7", "prompt_len": 81, "max_tokens": 11, "acceptance": "all"},
            ],
            "events": [{"step": 30, "kind": "resubmit", "request": "7"}],
        }
    )


def sync_streaming_turn() -> Workload:
    """Sync + drafts + streaming: a turn cut by max_tokens in the middle of accepted drafts keeps
    the cut positions in num_computed_tokens (0.32.0: no placeholders to take them off), and the
    next chunk has nothing to schedule: vLLM asserts num_new_tokens > 0."""
    return Workload.from_dict(
        {
            "name": "sync-streaming-turn",
            "seed": 615,
            "config": {
                **ROOMY_ASYNC,
                "max_num_batched_tokens": 12,
                "max_num_seqs": 4,
                "async_scheduling": False,
                "block_size": 4,
                "num_blocks": 1601,
                "max_model_len": 256,
            },
            "requests": [{"id": "2", "prompt_len": 8, "max_tokens": 11, "streaming": True}],
            "events": [{"step": 6, "kind": "stream_append", "request": "2", "tokens": 1, "max_tokens": 3}],
        }
    )


def sync_streaming_turn_runs_on() -> Workload:
    """The same cut, with a chunk long enough to schedule: the next turn runs from the wrong
    position, so the session's next token is computed on the wrong context (T1) and its KV
    cache holds the wrong tokens (K1). Found by explore (seed 467106246), shrunk: 1 request,
    3 steps."""
    return Workload.from_dict(
        {
            "name": "sync-streaming-turn-runs-on",
            "seed": 467106246,
            "acceptance": "all",
            "config": {
                "max_num_batched_tokens": 3,
                "max_num_seqs": 1,
                "num_spec_tokens": 1,
                "async_scheduling": False,
                "block_size": 4,
                "num_blocks": 37,
                "max_model_len": 256,
            },
            "requests": [{"id": "0", "prompt_len": 1, "max_tokens": 2, "streaming": True}],
            "events": [{"step": 1, "kind": "stream_append", "request": "0", "tokens": 3, "max_tokens": 1}],
        }
    )


def padded_admission_cut_by_threshold() -> Workload:
    """A 1-token admission padded to 1 + k tokens for a uniform spec-decode step, then cut by a
    smaller long_prefill_token_threshold: vLLM asserts once the blocks are allocated."""
    return Workload.from_dict(
        {
            "name": "padded-admission-cut",
            "config": {
                "max_num_batched_tokens": 16,
                "max_num_seqs": 2,
                "num_spec_tokens": 4,
                "async_scheduling": False,
                "block_size": 4,
                "num_blocks": 4,
                "long_prefill_token_threshold": 4,
            },
            "requests": [
                {"id": "1", "prompt_len": 2, "max_tokens": 2},
                {"id": "2", "prompt_len": 2, "max_tokens": 1},
                {"id": "3", "prompt_len": 1, "max_tokens": 1},
            ],
        }
    )


def pause_kept_batch() -> Workload:
    """pause(keep, clear_cache=false) at step 6, resume at 8, two decoding requests with rejected
    drafts: the drain applied step 5, so the scheduler's num_computed_tokens is exact at step 8,
    and the V1 runner, whose batch still holds step 5, applies its deferred correction again."""
    return Workload.from_dict(
        {
            "name": "pause-kept-batch",
            "seed": 3,
            "acceptance": "alternate",
            "max_steps": 200,
            "config": {"max_num_batched_tokens": 64, "num_spec_tokens": 3, "block_size": 32, "num_blocks": 500},
            "requests": [
                {"id": "0", "prompt_len": 5, "max_tokens": 30},
                {"id": "1", "prompt_len": 5, "max_tokens": 30},
            ],
            "events": [
                {"step": 6, "kind": "pause", "mode": "keep", "clear_cache": False},
                {"step": 8, "kind": "resume"},
            ],
        }
    )


def _notation(text: str) -> Callable[[], Workload]:
    """A workload in the one-line notation (workloads/notation.py)."""

    def build() -> Workload:
        from specreplay.replay.workloads.notation import workload_from_notation

        return workload_from_notation(text)

    return build


def _scenario(name: str) -> Callable[[], Workload]:
    def build() -> Workload:
        from specreplay.replay.workloads.scenarios import build_scenario

        return build_scenario(name)

    return build


@dataclass(frozen=True)
class KnownBug:
    key: str  # the workload's name: a scenario, or one of the builders above
    title: str
    decided_by: str  # "scheduler": its real scheduler decides; "runner": the GPU model runner does
    build: Callable[[], Workload]
    code: str  # the finding that shows it
    step: int | None = None
    asserts: tuple[str, ...] = field(default_factory=tuple)  # a crash: one of these in its message
    # The finding that shows the same failure on another runner family's state, where `code`
    # compares state that family does not have (V1's persistent batch, its cached drafts).
    runner_codes: Mapping[str, str] = field(default_factory=dict)
    # The registered engine whose real scheduler this failure is about (its code reads that
    # engine's state): vLLM's for most, "sglang-scheduler" for SGLang's own.
    engine: str = "vllm-scheduler"
    pre_fix: str | None = None  # SGLang: the implementation with the code before the fix (a built-in variant)

    def code_on(self, runner: str) -> str:
        """The finding that shows this failure on runner family `runner`."""
        return self.runner_codes.get(runner, self.code)


KNOWN_BUGS = (
    KnownBug(
        "reentry",
        "the seed: a request the token budget skipped re-enters with draft slots no draft is behind",
        "runner",
        _scenario("reentry"),
        "X5-placeholder-drafts",
        # Model Runner V2 keeps the request's slot and the drafts proposed after its last step: its
        # form of the waste would be slots verified with drafts that are not the request's own.
        runner_codes={"v2": "M3-draft-origin"},
    ),
    KnownBug(
        "resubmit",
        "same-id resubmission: the old life's output goes to the new life, placeholders < 0",
        "scheduler",
        _scenario("resubmit"),
        "E1-engine-crash",
        asserts=("num_output_placeholders",),
    ),
    KnownBug(
        "resubmit-then-reset",
        "same-id resubmission, later form: the stale count drained below 0 after a cache reset",
        "scheduler",
        resubmit_then_reset,
        "E1-engine-crash",
        asserts=("num_stale_output_tokens",),
    ),
    KnownBug(
        "resubmit-onto-waiting",
        "same-id resubmission while the new life waits: the old life's tokens reach the new life, no assert",
        "scheduler",
        resubmit_onto_waiting_life,
        "T1-wrong-token",
    ),
    KnownBug(
        "streaming-preempt",
        "a streaming session preempted with a step in flight is lost (never scheduled again)",
        "scheduler",
        _scenario("streaming-preempt"),
        "E2-run-incomplete",
    ),
    KnownBug(
        "sync-streaming-turn",
        "sync streaming turn cut inside accepted drafts: the next chunk has nothing to schedule",
        "scheduler",
        sync_streaming_turn,
        "E1-engine-crash",
        asserts=("num_new_tokens > 0", "admitted with 0 tokens"),
    ),
    KnownBug(
        "sync-streaming-turn-runs-on",
        "the same cut with a longer chunk: the next turn runs from the wrong position (wrong tokens)",
        "scheduler",
        sync_streaming_turn_runs_on,
        "T1-wrong-token",
    ),
    KnownBug(
        "padded-admission-cut",
        "a 1-token admission padded for spec decode, then cut by long_prefill_token_threshold",
        "scheduler",
        padded_admission_cut_by_threshold,
        "E1-engine-crash",
        asserts=("padded to", "num_new_tokens == 1 + self.num_spec_tokens"),
    ),
    KnownBug(
        "pause-kept-batch",
        "the runner's deferred correction repeated after a pause that kept the batch",
        "runner",
        pause_kept_batch,
        "X2-sched-worker-computed",
        step=8,
    ),
    # SGLang 0.5.23's scheduler (measured on the real one: `--engine sglang-scheduler`)
    KnownBug(
        "sglang-stop-overcommit",
        "SGLang #24590: a stop-token finish under overlap releases, and radix-caches, one position more than "
        "without overlap (a decode launched after the stop)",
        "scheduler",
        _notation("d:p3,t8,stop3 | k0 async name sglang-stop-overcommit"),
        "G5-overcommit-at-finish",
        engine="sglang-scheduler",
    ),
    KnownBug(
        "sglang-abort-overcommit",
        "SGLang: an abort under overlap releases the KV of a decode launched after it was taken",
        "scheduler",
        _notation("a:p4,t16 | k0 async name sglang-abort-overcommit | abort(a)@4"),
        "G5-overcommit-at-finish",
        engine="sglang-scheduler",
    ),
    KnownBug(
        "sglang-stale-verify",
        "SGLang #23456: an EAGLE verify result processed after its request stopped still commits its accept length",
        "scheduler",
        _notation("a:p4,t20,stop4,all | k3 async name sglang-stale-verify"),
        "G3-stale-result-applied",
        engine="sglang-scheduler",
        pre_fix="sglang-stale-commit",
    ),
    KnownBug(
        "sglang-stale-retract",
        "SGLang #23456, retraction form: a verify result of a retracted request commits its accept length",
        "scheduler",
        _notation("0-5:p4,t20 | blocks 5 block 16 k3 async name sglang-stale-retract"),
        "G3-stale-result-applied",
        engine="sglang-scheduler",
        pre_fix="sglang-stale-commit",
    ),
    KnownBug(
        "sglang-abort-past-max",
        "SGLang: an abort taken in the EAGLE round that crosses max_tokens sends the client the whole round",
        "scheduler",
        _notation("b:p3,t12,all | k3 sync name sglang-abort-past-max | abort(b)@4"),
        "G8-delivered-past-max-tokens",
        engine="sglang-scheduler",
    ),
    KnownBug(
        "sglang-embeds-retract",
        "SGLang #39645's class: a retracted input_embeds request generates its outputs anew and its streaming "
        "client gets the new generation's first tokens a second time",
        "scheduler",
        _notation("0-3:p4,t20,embeds | blocks 4 block 16 k3 async noapc name sglang-embeds-retract"),
        "G9-client-tokens",
        engine="sglang-scheduler",
    ),
    KnownBug(
        "sglang-adaptive-upswitch",
        "SGLang #36897: adaptive speculation picks a wider draft width when a batch's forward starts, after the "
        "scheduler reserved the batch's KV for the narrower one; the verify writes into other requests' KV",
        "scheduler",
        _notation(
            "a:p4,t80,all 1-6:p4,t6,all@20 h:p4,t20,all@20 | k1 async seqs 8 budget 64 adaptive "
            "name sglang-adaptive-upswitch"
        ),
        "K2-kv-foreign-tokens",
        engine="sglang-scheduler",
        pre_fix="sglang-adaptive-reserve-current",
    ),
    KnownBug(
        "sglang-session-overclaim",
        "SGLang's streaming session hands the next turn the finished length as computed KV, one position past "
        "what was written when the turn ended on a verify's correction token (the finishing round is skipped)",
        "scheduler",
        _notation("s:p4,t8,stream,none | k1 async apc name sglang-session-overclaim | append(s)@20:p4"),
        "G10-turn-past-computed",
        engine="sglang-scheduler",
    ),
    KnownBug(
        "sglang-session-rows-held",
        "SGLang #37583's class: idle streaming sessions hold every request row, and admission counts only free "
        "rows, so their own next turns (which borrow the rows they hold) are never scheduled",
        "scheduler",
        _notation("s:p4,t4,stream | seqs 1 async apc steps 40 name sglang-session-rows-held | append(s)@8:p3"),
        "E2-run-incomplete",
        engine="sglang-scheduler",
    ),
)
