"""Recorded outcomes of an SGLang trace as the oracle: its tokens, drafts and accept lengths drive a replay.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. `specreplay replay REC` of a trace recorded with `--engine
sglang-scheduler` reruns it on that engine with a `SglangRecordedOracle` in place of the
workload's seeded model: the reference SGLang worker (families/sglang/worker.py) asks it for the
token at each position (`token_at`) and for the drafter's proposal (`drafts`), and gets back what
the recorded worker emitted and verified there.

The SGLang worker's view holds every outcome, the ignored results' included (a verify round
launched before its request finished, whose result `process_batch_result` skipped): an SGLang row
writes positions `P .. P + n - 1` (`worker_first_position`, `worker_num_scheduled_tokens`), the
last `d` of them drafts (`worker_num_draft_slots`, `worker_draft_ids`), and `worker_sampled_ids`
are the tokens at `P + n - d`, `P + n - d + 1`, ... (an extend: the token after its chunk; a
decode: the token after its input; an EAGLE v2 round, L = P: the accepted drafts at L + 1 .. and
the correction token). A chunk that ends before the request's fill samples nothing the scheduler
takes and records nothing. So unlike a vLLM recording (families/vllm/outcomes.py: applied
outputs, clamped inputs, placeholder drafts) every row's tokens sit at known positions, and every
draft list the worker verified is the drafter's proposal (its first is the one the previous round
relayed through the scheduler; the reference worker asks `drafts` for it at that round's end).

The accept length is not stored apart: the reference worker accepts the leading drafts that equal
the tokens, as EAGLE's greedy verify does, so the recorded drafts and tokens give it back. A row
whose recorded accept length they do not give (or whose tokens and drafts contradict each other)
cannot drive the reference worker: one line, exit 2.

The stop token of a `stop_at` request is not stored either: a request that finished on it
(`apply_finish_reason` stop) delivered it last, so the outcome's count of what its client
received (`engine_output_tokens`) gives its position. (Not the last token the finish appended: a
verify round appends its whole accepted run, and SGLang cuts the delivery at the stop.)

What the recording never observed (a what-if through a variant that schedules other positions):
a token past what was recorded follows the workload's seeded model from the recorded token before
it (`tokens.next_token`); a proposal never verified is the workload's drafter (its acceptance
rule) over those tokens. That is the model an `sglang-scheduler` recording was made with, so where
the recording is silent a replay runs as `--oracle synthetic` would, and where it speaks, as
recorded. `unobserved(table)` (inherited) counts what was filled.
"""

from __future__ import annotations

from typing import Any

from specreplay.replay.families.vllm.outcomes import RecordedOracle, has_outcomes
from specreplay.replay.workloads.oracle import Oracle, ReplayContext
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError
from specreplay.traces.families import EngineLine

#: The columns an SGLang recording's outcomes are read from.
COLUMNS = (
    "step",
    "request_id",
    "sched_num_prompt_tokens",
    "worker_first_position",
    "worker_num_scheduled_tokens",
    "worker_num_draft_slots",
    "worker_draft_ids",
    "worker_num_accepted",
    "worker_num_emitted",
    "worker_sampled_ids",
    "apply_finish_reason",
)
#: The trace header's drafter of a replay of an SGLang run with draft steps (`impl.drafter`;
#: "none" without): EAGLE v2, topk 1. Nothing reads it back: `drafts` is the same for both.
DRAFTER = "eagle"


def has_sglang_outcomes(table: Any) -> bool:
    """Does an SGLang trace carry its worker's outcomes (schema v7: worker_sampled_ids on some row)?"""
    return has_outcomes(table, "worker_sampled_ids")


class SglangRecordedOracle(RecordedOracle):
    """The oracle of a replay of an SGLang recording: recorded tokens and drafts (module docstring)."""

    line = EngineLine.SGLANG
    turn_keeps_last_sampled = True  # SGLang's streaming session (families/sglang/sessions.py)

    def __init__(
        self,
        workload: Workload,
        table: Any,
        received: dict[str, int] | None = None,
        context: ReplayContext | None = None,
    ) -> None:
        self._seeded = Oracle(workload)  # the drafter's rule for a proposal never recorded
        self._seeded.turn_keeps_last_sampled = True
        self.received = dict(received or {})  # request -> output tokens its client received (the outcome's)
        self.stopped: set[str] = set()  # requests the recording finished on their stop token
        drafter = DRAFTER if workload.config.num_spec_tokens else "none"
        super().__init__(workload, table, drafter=drafter, context=context)

    def _read(self, table: Any) -> None:
        for _, row, seen, first, drafts in self._worker_rows(table, COLUMNS):
            sampled = list(row["worker_sampled_ids"] or [])
            self._check_sglang_row(row, drafts, sampled)
            if drafts:
                seen.drafts.setdefault(first, drafts)
                seen.proposed.setdefault(first, len(drafts))
            for j, token in enumerate(sampled):
                self._note(seen, first + j, token)
            if row["apply_finish_reason"] == "stop":
                self.stopped.add(row["request_id"])

    def _check_sglang_row(self, row: dict[str, Any], drafts: list[int], sampled: list[int]) -> None:
        """A row the reference worker could not have produced cannot drive it: one line."""
        where = f"recorded outcomes inconsistent at step {row['step']}, request {row['request_id']!r}"
        if row["worker_num_emitted"] is not None and row["worker_num_emitted"] != len(sampled):
            raise InputError(f"{where}: {row['worker_num_emitted']} tokens emitted, {len(sampled)} recorded")
        if any(t < 0 or t >= self.vocab for t in sampled):  # a draft may be anything its relay carried
            raise InputError(f"{where}: a sampled token outside the vocabulary (0..{self.vocab - 1})")
        accepted = row["worker_num_accepted"]
        if not drafts:
            if accepted or len(sampled) > 1:
                raise InputError(f"{where}: {len(sampled)} tokens and {accepted or 0} accepted without drafts")
            return
        if not sampled:
            return  # a verify round always samples: nothing recorded, nothing to hold it to
        matching = 0
        while matching < min(len(drafts), len(sampled)) and drafts[matching] == sampled[matching]:
            matching += 1
        if accepted is None or accepted != matching or len(sampled) != accepted + 1:
            raise InputError(
                f"{where}: accept length {accepted} with {len(sampled)} tokens {sampled} for drafts {drafts}; "
                "the reference SGLang worker accepts the leading drafts equal to the tokens, then one more token"
            )

    def stop_token(self, rid: str) -> int | None:
        """The stop token the recorded run was given: the last output its client received, for
        a request the recording finished on it; else its N-th output (`stop_at = N`) by this
        oracle, the seeded model's wherever the recording holds the seeded model's tokens."""
        spec = self.specs[rid]
        if spec.stop_at is None:
            return None
        n = self.received.get(rid) if rid in self.stopped else None
        return self.token_at(rid, self.prompt_length(rid) + (n or spec.stop_at) - 1)

    def drafts(self, rid: str, first_position: int, k: int, prompt_len: int | None = None) -> list[int]:
        """The recorded proposal for positions first_position.. ; one never recorded (or the rest
        of a shorter one) is the workload's drafter over the recorded tokens."""
        recorded = list(self._seen(rid, prompt_len).drafts.get(first_position, ()))[:k]
        if len(recorded) == k:
            return recorded
        seeded = self._seeded_drafts(rid, first_position, k, prompt_len)
        return recorded + seeded[len(recorded) :]

    def _seeded_drafts(self, rid: str, first_position: int, k: int, prompt_len: int | None) -> list[int]:
        """The workload's acceptance rule applied to this oracle's tokens at those positions."""
        truth = [self.token_at(rid, q, prompt_len) for q in range(first_position, first_position + k)]
        proposal = self._seeded.drafts(rid, first_position, k, prompt_len)
        seeded_truth = [self._seeded.token_at(rid, q, prompt_len) for q in range(first_position, first_position + k)]
        # The seeded drafter is right where its draft equals its own token: right here too.
        return [t if p == s else (t + 1) % self.vocab for t, p, s in zip(truth, proposal, seeded_truth)]


def sglang_recorded_oracle(
    workload: Workload, trace: Any, slot_drafts: bool = False, context: ReplayContext | None = None
) -> SglangRecordedOracle:
    """The oracle of an SGLang `trace`'s recorded outcomes, refused in one line when it has none."""
    if not has_sglang_outcomes(trace.table):
        name = trace.workload.name if trace.workload.name is not None else "the trace"
        raise InputError(
            f"{name}: no recorded outcomes of SGLang's worker (worker_sampled_ids is empty on every row); "
            "replay it with --oracle synthetic"
        )
    return SglangRecordedOracle(workload, trace.table, trace.outcome.engine_output_tokens, context)


__all__ = ["COLUMNS", "DRAFTER", "SglangRecordedOracle", "has_sglang_outcomes", "sglang_recorded_oracle"]
