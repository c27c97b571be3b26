"""The catalogue: one row per finding code, the single list everything else is derived from.

Where it sits: inside check. Each row (`Invariant`) holds:

    code, severity  stable; `specreplay codes` lists them
    statement       the rule in one line
    source          the invariant it enforces, by its name in the reference (docs/reference.md
                    section 4.2), or the group of section 4.3 it belongs to: request lives,
                    ground truth, engine
    rank            within one step and request, the finding that explains the others comes first
    rule            the function of a rule family (rules_*.py) that reports the code
    message, sides  how its finding is rendered from the evidence: the one-line message, and which
                    evidence the 0.1 JSON keys `scheduler` and `worker` carry
    scope           "rows": the rule runs over every frame of rows; "run": once, on the outcome
    runners         the runner families it is about: a code about V1's runner state does not run
                    on a Model Runner V2 trace (and is listed not checked there), an MRV2 code
                    (docs/reference.md section 9) runs on MRV2 traces only, an SGLang code
                    (section 10) on SGLang traces only; the codes whose meaning holds on both
                    engines (tokens, KV truth, the batch, the run) name every family

Several codes come from one rule (S3 and the X2 codes from the computed-tokens rule; E1,
X5-negative-input-id and G7 from the crash rule; the two M1 codes from MRV2's device-count rule):
the rule runs once and reports each of them.

Derived here, never listed twice: `all_codes()`, `SEVERITY`, `RANK`, `INVARIANTS` (the row that
heads each rule) and `EXTRA_CODES` (the other codes a rule reports).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from specreplay.replay.check import (
    rules_batch,
    rules_counters,
    rules_drafts,
    rules_kv,
    rules_lives,
    rules_mrv2,
    rules_outputs,
    rules_preemption,
    rules_run,
    rules_sglang,
    rules_truth,
    rules_waste,
)
from specreplay.replay.check.findings import Finding

#: A rule: (frame, checker) -> findings; for scope "run" the frame is None.
RuleFunction = Callable[[Any, Any], Iterable[Finding]]
#: The evidence a message reads: step, request_id, life, field, expected, actual and the rule's detail, by name.
Evidence = SimpleNamespace


@dataclass(frozen=True)
class Invariant:
    code: str  # stable, e.g. "X2-sched-worker-computed"
    severity: str  # "error" | "warning"
    rank: int  # order within one step and request: lower first
    statement: str  # the rule in one line (`specreplay codes`)
    source: str  # the reference invariant (INV-*) or what part of the run it is about
    rule: RuleFunction  # reports this code (and maybe others)
    message: Callable[[Evidence], str]  # the finding's one-line message, from its evidence
    sides: tuple[str | None, str | None]  # the evidence `scheduler` and `worker` carry (None: None)
    scope: str = "rows"  # "rows": over each frame; "run": once, after the last frame
    # The worker runner families (engines/registry.py) whose traces the code is about: V1's
    # persistent-batch state (v1), Model Runner V2's slots (v2), what both share (vLLM's
    # scheduler: the default), SGLang's scheduler (sglang), or every engine (ALL).
    runners: tuple[str, ...] = ("v1", "v2")

    @property
    def check(self) -> RuleFunction:
        """The rule (specreplay 0.1's name for it)."""
        return self.rule

    def finding(
        self, step: int, request_id: str | None, life: int | None, field: str, expected: Any, actual: Any, **detail: Any
    ) -> Finding:
        """This code's Finding from its evidence: the message and the scheduler/worker values are
        rendered here, the same way for every rule that reports the code."""
        step, life, expected, actual = _plain(step), _plain(life), _plain(expected), _plain(actual)
        detail = {name: _plain(value) for name, value in detail.items()}
        evidence = Evidence(
            step=step, request_id=request_id, life=life, field=field, expected=expected, actual=actual, **detail
        )
        scheduler, worker = (None if name is None else getattr(evidence, name) for name in self.sides)
        return Finding(
            self.code,
            self.severity,
            step,
            request_id,
            field,
            scheduler,
            worker,
            self.message(evidence),
            expected=expected,
            actual=actual,
            life=life,
            detail=tuple(sorted(detail.items())),
        )


def _plain(value: Any) -> Any:
    """numpy scalars as Python values (findings go to JSON)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


# ------------------------------------------------------------------ messages with more than one shape
def _s5_message(e: Evidence) -> str:
    s = e.previous_step
    why = {
        "not_scheduled": f"it was not scheduled at step {s}, so the worker holds no drafts for it",
        "prefill_chunk": f"its step {s} was a non-final prefill chunk, which proposes no drafts",
        "resumed": "it resumes from preemption",
        "empty_step": f"step {s} was empty",
    }[e.reason]
    return (
        f"scheduled {e.actual} draft slots with no drafts behind them: {why} "
        "(stale -1 placeholders; the slots are verified and wasted)"
    )


def _s6_message(e: Evidence) -> str:
    if e.field == "num_scheduled_tokens":  # one request
        return f"schedules past max_model_len {e.max_model_len}"
    return (
        f"total_num_scheduled_tokens is {e.actual}; the requests add up to {e.expected}; "
        f"budget {e.max_num_batched_tokens}"
    )


def _x2_position_message(e: Evidence) -> str:
    p, t = e.actual, e.expected
    gap = f"positions {t}..{p - 1} are never written" if p > t else f"positions {p}..{t - 1} are written twice"
    return f"the worker writes step {e.step} from position {p} but its KV cache holds {t} valid tokens: {gap}"


def _x5_message(e: Evidence) -> str:
    negative = e.worker_num_negative_draft_ids
    return f"the worker verified {e.actual} draft slots with no cached drafts behind them" + (
        f" ({negative} of them -1, clamped to 0 for the embedding and rejected)" if negative else ""
    )


def _l2_message(e: Evidence) -> str:
    if e.expected == "stale":
        return (
            f"the output of step {e.output_step} was in flight when the request was preempted or its "
            f"cache reset, yet update_from_output applied it as fresh at step {e.step}: its "
            f"{e.apply_num_tokens} tokens and {e.apply_num_rejected} rejections moved the reset counters"
        )
    return (
        f"the output of step {e.output_step} belongs to the request's current life (no preemption "
        f"or reset since), yet update_from_output treated it as stale ({e.actual}) at step "
        f"{e.step}: its tokens are lost or its counters never settle"
    )


def _s9_message(e: Evidence) -> str:
    if e.reason == "max_tokens":
        return (
            f"scheduled {e.actual} tokens for nothing: the output in flight already takes it to max_tokens "
            f"{e.max_tokens} ({e.sched_num_computed_tokens} computed + 2 - {e.sched_num_output_placeholders} "
            f"placeholders >= {e.sched_num_prompt_tokens} prompt + {e.max_tokens}); vLLM's running loop skips "
            "it, and this step's output comes back to a finished request"
        )
    return (
        f"scheduled {e.actual} tokens for nothing: the output of step {e.output_step}, applied at step "
        f"{e.apply_step}, already finished it ({e.apply_finish_reason})"
    )


def _l3_message(e: Evidence) -> str:
    got, want = e.actual, e.expected
    counted = "in flight" if e.field == "num_in_flight_tokens" else "in flight from before the last preemption or reset"
    return f"{e.field} is {got} but the scheduled tokens of its outputs {counted} add up to {want}" + (
        " (a count never goes negative)"
        if got < 0
        else "; counted in steps or sampled tokens instead of scheduled tokens?"
        if got and want
        else ""
    )


def _e2_message(e: Evidence) -> str:
    listed = f"({', '.join(e.unfinished[:5])}{'...' if len(e.unfinished) > 5 else ''})"
    if e.status == "step_limit":
        return f"the run hit the step limit with {e.actual} requests unfinished {listed}: livelock or starvation"
    return (
        f"the engine went idle for good with {e.actual} requests unfinished {listed}: the scheduler holds them "
        "but will never schedule them (in no queue it admits from); their clients wait forever"
    )


def _m3_message(e: Evidence) -> str:
    why = {
        "padding": "none was proposed for it since it took its slot (the slot's zeroed draft row)",
        "other_request": f"they were proposed for request {e.worker_draft_proposed_for!r}",
        "not_last_step": (
            f"they were proposed at step {e.worker_draft_proposed_step}, not at its last step in the batch "
            f"({e.last_worker_step})"
        ),
        "moved_past": (
            f"they follow position {e.worker_draft_base}, but it runs from {e.worker_device_computed_before}: "
            "it has moved since they were proposed"
        ),
    }[e.reason]
    return f"verified {e.actual} draft slots whose drafts are not its own next tokens: {why} (the slots are wasted)"


def _m4_message(e: Evidence) -> str:
    if e.reason == "kept":
        return (
            "listed preempted, but the worker kept its slot and state "
            "(MRV2 frees a preempted request like a finished one)"
        )
    if e.reason == "not_new":
        return (
            "back after its preemption, it did not arrive as a new request (scheduled_new_reqs), yet its slot was freed"
        )
    return (
        f"back after its preemption as a new request with a prefill of {e.actual} tokens, but it has "
        f"{e.expected} (prompt {e.sched_num_prompt_tokens} and its outputs): tokens lost or doubled"
    )


# ------------------------------------------------------------------ SGLang's messages
def _g_when(e: Evidence) -> str:
    """When a G1 / G2 value was read: after the scheduling, or after a result's processing."""
    if e.result_step is None:
        return "after the scheduling"
    return f"after process_batch_result of step {e.result_step}'s result"


def _g1_message(e: Evidence) -> str:
    when = _g_when(e)
    why = (
        "a retracted request holds no KV and must commit none; its next extend overwrites the count"
        if e.retracted
        else "it counts KV slots it does not hold"
    )
    return f"kv_committed_len {e.actual} exceeds kv_allocated_len {e.expected} {when}: {why}"


def _g2_message(e: Evidence) -> str:
    when = _g_when(e)
    return (
        f"kv_committed_len is {e.actual} {when}, but the KV the worker wrote holds {e.expected} valid positions "
        f"(as of step {e.truth_step}): the scheduler counts positions no forward wrote, and a release would insert "
        "them into the radix cache for later requests to read"
    )


def _g3_message(e: Evidence) -> str:
    cut = f"had finished (step {e.cut_step})" if e.reason == "finished" else f"was retracted (step {e.cut_step})"
    (c0, a0), (c1, a1) = e.kv_before, e.kv_after
    what = []
    if e.apply_num_tokens:
        what.append(f"appended {e.apply_num_tokens} tokens")
    if c1 != c0:
        what.append(f"moved kv_committed_len {c0} -> {c1}")
    if a1 != a0:
        what.append(f"moved kv_allocated_len {a0} -> {a1}")
    did = ", ".join(what) if what else f"skipped it as {e.apply_skip_reason or 'applied'}, not as {e.reason}"
    return (
        f"the result of step {e.step}, processed at step {e.apply_step}, came back after the request {cut}, "
        f"yet process_batch_result {did} (#23456's class: a late result must change nothing)"
    )


def _g4_message(e: Evidence) -> str:
    at = f"the retraction at step {e.retracted_at}"
    return {
        "dropped": f"{at} left it {e.actual} of its {e.expected} outputs: its next life re-prefills without the rest",
        "spliced": (
            f"retracted at step {e.retracted_at} with {e.expected} outputs, it has {e.actual} before its next life "
            "sampled: tokens were added to or taken from a retracted request"
        ),
        "not_extend": f"its first forward after {at} is a {e.actual}, not an extend over its prompt and outputs",
        "fill": (
            f"the extend of its next life ends at position {e.actual}, not at prompt + the {e.outputs_kept} outputs "
            f"kept at {at} ({e.expected}): its next token is sampled at the wrong position"
        ),
        "committed": (
            f"after the extend of its next life kv_committed_len is {e.actual}, not prompt + the {e.outputs_kept} "
            f"outputs kept at {at} ({e.expected})"
        ),
    }[e.reason]


def _g5_message(e: Evidence) -> str:
    return (
        f"the overlap launched this forward for a request its own in-flight result (step {e.result_step}'s, "
        f"processed at step {e.apply_step}) finishes ({e.finish}): the forward is wasted (its result is skipped), and "
        f"the release inserted {e.actual} positions into the radix cache where only {e.expected} were valid before it, "
        f"keeping what it wrote only because of the overlap's timing (without overlap {e.expected} positions)"
    )


def _g6_message(e: Evidence) -> str:
    kind, gave = ("verify", "published") if e.verify else ("decode", "leaves next")
    own = f" (the scheduler's own seq_lens entry: {e.sched_seq_len})" if e.sched_seq_len is not None else ""
    return (
        f"the {kind} runs at seq_len {e.actual}, but the request's latest forward (step {e.published_step}) {gave} "
        f"{e.expected}{own}: the FutureMap handed it another forward's length"
    )


#: The codes about V1's runner state alone (its persistent batch, its cached drafts, its CPU counts).
V1 = ("v1",)
#: Model Runner V2's codes.
V2 = ("v2",)
#: SGLang's scheduler's codes (rules_sglang.py, docs/reference.md section 10).
SGLANG = ("sglang",)
#: The codes whose meaning holds on every engine, whose columns an SGLang row fills too: tokens
#: and the KV truth against the oracle, the batch the worker ran, tokens lost, the run's end.
ALL = ("v1", "v2", "sglang")
#: The runner families of vLLM's scheduler: on a trace of one, a code about the other is listed not
#: checked (V1's runner codes on MRV2); an SGLang trace lists no vLLM code, a vLLM trace no G code.
VLLM_RUNNERS = ("v1", "v2")

# ------------------------------------------------------------------ the rows
# By rule family; a rule runs where its first row is (the row that heads it). `rank` orders findings
# within a step and request: an edited output, then the two views disagreeing, then what follows
# from it (KV, placeholders, tokens).
CATALOGUE: tuple[Invariant, ...] = (
    # --- scheduler counters (rules_counters)
    Invariant(
        "S1-placeholders-nonnegative",
        "error",
        16,
        "num_output_placeholders >= 0 at all times",
        "INV-S1",
        rules_counters.check_placeholders_nonnegative,
        sides=("actual", None),
        message=lambda e: f"num_output_placeholders went negative ({e.actual}); vLLM asserts and the engine dies",
    ),
    Invariant(
        "S2-placeholder-count",
        "error",
        14,
        "P = sum over steps in flight of (1 + draft slots)",
        "INV-S2",
        rules_counters.check_placeholder_count,
        sides=("actual", "expected"),
        message=lambda e: (
            f"num_output_placeholders is {e.actual} but the steps in flight "
            f"({', '.join(str(s) for s in e.steps_in_flight) or 'none'}) account for {e.expected}"
        ),
    ),
    Invariant(
        "S3-scheduler-computed-tokens",
        "error",
        11,
        "C minus in-flight rejections = tokens valid in the KV cache",
        "INV-S3",
        rules_counters.check_computed_tokens,
        sides=("actual", "expected"),
        message=lambda e: (
            f"the scheduler's num_computed_tokens, once its in-flight rejections are taken off, is "
            f"{e.actual} but the KV cache holds {e.expected} valid tokens"
        ),
    ),
    Invariant(
        "X2-sched-worker-computed",
        "error",
        10,
        "worker C = scheduler C minus rejections of m-1",
        "INV-X2",
        rules_counters.check_computed_tokens,
        sides=("expected", "actual"),
        message=lambda e: (
            f"scheduler and worker disagree on num_computed_tokens at step {e.step}: {e.expected} vs {e.actual}"
        ),
        runners=V1,
    ),
    Invariant(
        "X2-worker-kv-position",
        "error",
        12,
        "the worker writes from the first position not yet in its KV",
        "INV-X2",
        rules_counters.check_computed_tokens,
        sides=("sched_num_computed_tokens", "actual"),
        message=_x2_position_message,
    ),
    Invariant(
        "X2-worker-position-mismatch",
        "error",
        13,
        "CPU num_computed_tokens = device position",
        "INV-X2 (design B)",
        rules_counters.check_computed_tokens,
        sides=("actual", "expected"),
        message=lambda e: (
            f"the worker's CPU num_computed_tokens ({e.actual}) differs from the device position "
            f"it computes with ({e.expected})"
        ),
        runners=V1,
    ),
    Invariant(
        "S4-decode-identity",
        "error",
        15,
        "num_tokens + P - C = 1 for a decoding request",
        "INV-S4",
        rules_counters.check_decode_identity,
        sides=("actual", "expected"),
        message=lambda e: (
            f"num_tokens + num_output_placeholders - num_computed_tokens is {e.actual}, "
            f"expected {e.expected} for a decoding request (its next demand is wrong)"
        ),
    ),
    Invariant(
        "X3-output-length",
        "error",
        18,
        "worker output length = applied outputs + placeholders (design B)",
        "INV-X3",
        rules_counters.check_output_length,
        sides=("expected", "actual"),
        message=lambda e: (
            f"the worker holds {e.actual} output tokens, the scheduler sent {e.expected} (applied + placeholders)"
        ),
        runners=V1,
    ),
    Invariant(
        "L3-in-flight-tokens",
        "error",
        17,
        "num_in_flight_tokens / num_stale_output_tokens = scheduled tokens of the outputs in flight / in flight "
        "across the last cut, never negative",
        "request lives",
        rules_counters.check_in_flight_tokens,
        sides=("actual", "expected"),
        message=_l3_message,
    ),
    # --- draft slots (rules_drafts)
    Invariant(
        "S5-draft-provenance",
        "warning",
        3,
        "draft slots only for requests whose previous step proposed drafts",
        "INV-S5",
        rules_drafts.check_draft_provenance,
        sides=("actual", "expected"),
        message=_s5_message,
        runners=V1,
    ),
    Invariant(
        "S7-draft-slot-count",
        "error",
        20,
        "k = max(0, min(len(spec), n + C - T - P))",
        "INV-S7",
        rules_drafts.check_draft_slot_count,
        sides=("actual", "expected"),
        message=lambda e: (
            f"{e.actual} draft slots scheduled inside {e.sched_num_scheduled_tokens} tokens; "
            f"the counters allow {e.expected}"
        ),
    ),
    Invariant(
        "X5-placeholder-drafts",
        "warning",
        22,
        "draft inputs are drafts cached for the request at m-1",
        "INV-X5",
        rules_drafts.check_draft_inputs,
        sides=("actual", "expected"),
        message=_x5_message,
        runners=V1,
    ),
    # --- the batch (rules_batch)
    Invariant(
        "S6-token-budget",
        "error",
        21,
        "sum of scheduled tokens = total <= max_num_batched_tokens",
        "INV-S6",
        rules_batch.check_budget,
        sides=("actual", "expected"),
        message=_s6_message,
    ),
    Invariant(
        "X1-batch-membership",
        "error",
        19,
        "the worker's batch holds exactly the scheduled requests",
        "INV-X1",
        rules_batch.check_membership,
        sides=("expected", "actual"),
        runners=ALL,
        message=lambda e: (
            "scheduled but not in the worker's batch" if e.expected else "in the worker's batch but not scheduled"
        ),
    ),
    Invariant(
        "X10-scheduler-output-mutated",
        "error",
        4,
        "update_from_output reads the SchedulerOutput the worker was given unchanged",
        "INV-X10",
        rules_batch.check_output_mutated,
        sides=("expected", "actual"),
        message=lambda e: (
            f"update_from_output read {e.apply_num_scheduled_tokens} tokens with {e.actual} draft "
            f"slots back from the SchedulerOutput that was built with {e.sched_num_scheduled_tokens} "
            f"and {e.expected}: the worker edited the scheduler's own object"
        ),
    ),
    Invariant(
        "X11-executed-other-work",
        "warning",
        5,
        "the worker executes what the scheduler booked, less the drafts vLLM's ngram_gpu could not propose",
        "INV-X10",
        rules_batch.check_executed_work,
        sides=("expected", "actual"),
        message=lambda e: (
            f"the worker executed {e.actual} tokens ({e.worker_num_draft_slots} drafts) where the "
            f"scheduler booked {e.expected} ({e.sched_num_draft_slots} drafts)"
        ),
    ),
    # --- request lives (rules_lives)
    Invariant(
        "L1-output-life",
        "error",
        6,
        "an output is applied only to the life of the request it was scheduled for",
        "request lives",
        rules_lives.check_output_life,
        sides=("expected", "actual"),
        message=lambda e: (
            f"the output of step {e.step}, scheduled for life {e.expected} of the request, was "
            f"given to life {e.actual} (a new request under the same id) at step {e.apply_step} "
            f"({e.apply_outcome}, {e.apply_num_tokens} tokens): the old life's tokens and counts "
            "land on the new one"
        ),
    ),
    Invariant(
        "L2-stale-output",
        "error",
        7,
        "outputs in flight across a preemption or cache reset are stale (delivered without moving counters, "
        "or dropped); no other output is",
        "request lives",
        rules_lives.check_stale_outputs,
        sides=("actual", "expected"),
        message=_l2_message,
    ),
    # --- outputs applied against outputs emitted (rules_outputs)
    Invariant(
        "S8-token-lost",
        "error",
        8,
        "update_from_output applies every token the worker emitted, unless the output finished the request",
        "INV-S8",
        rules_outputs.check_tokens_applied,
        sides=("actual", "expected"),
        runners=ALL,
        message=lambda e: (
            f"the worker emitted {e.expected} tokens at step {e.step} but update_from_output applied "
            f"{e.actual} of them at step {e.apply_step}, with no stop, max_tokens or max_model_len to cut them: "
            f"{e.expected - e.actual} lost (the next step starts at the wrong position)"
        ),
    ),
    # --- wasted steps (rules_waste)
    Invariant(
        "S9-step-past-max-tokens",
        "warning",
        25,
        "no step for a request whose outputs in flight or applied already finish it (vLLM's max-tokens skip)",
        "INV-S9",
        rules_waste.check_wasted_steps,
        sides=("actual", "expected"),
        message=_s9_message,
    ),
    # --- preemption (rules_preemption)
    Invariant(
        "S10-needless-preemption",
        "warning",
        37,
        "a step preempts for KV blocks only when a request it schedules or preempts needs a block it does not hold",
        "INV-S10",
        rules_preemption.check_needless_preemption,
        sides=("actual", "expected"),
        message=lambda e: (
            f"preempted at step {e.step} although no request the step scheduled or preempted needed a KV block "
            f"it did not already hold ({e.scheduled_requests} scheduled, each within its own blocks): the "
            f"{e.held_blocks} or more blocks it held are freed for nothing, and it prefills again"
        ),
    ),
    Invariant(
        "S11-preemption-frees-nothing",
        "warning",
        47,
        "a request preempted for KV blocks returns the blocks it alone held to the free pool at once, where the "
        "allocation that preempted it can use them",
        "INV-S11",
        rules_preemption.check_preemption_returns,
        sides=("expected", "actual"),
        message=lambda e: (
            f"preempted for KV blocks at step {e.step}, but its preemption returned {e.actual} of the "
            f"{e.expected} blocks it alone held to the free pool (its free was deferred): the allocation it "
            f"was preempted for cannot use them, so the step preempts again or schedules less "
            f"({e.preempted_in_step} preempted at this step), and its KV is thrown away for nothing"
        ),
    ),
    Invariant(
        "T1-wrong-token",
        "error",
        24,
        "applied tokens equal the expected sequence",
        "ground truth",
        rules_truth.check_tokens,
        sides=("apply_num_tokens", "actual"),
        runners=ALL,
        message=lambda e: (
            f"{e.actual} of the {e.apply_num_tokens} tokens applied from step {e.step} differ "
            "from the request's expected sequence (a token lost, duplicated or computed at the "
            "wrong position)"
        ),
    ),
    Invariant(
        "K1-kv-content",
        "error",
        23,
        "valid KV positions hold the expected tokens",
        "ground truth",
        rules_truth.check_kv_truth,
        sides=(None, "truth_num_computed_tokens"),
        runners=ALL,
        message=lambda e: "the KV cache no longer holds the request's expected tokens in every valid position",
    ),
    # --- the physical KV cache: blocks, their holders and writers (rules_kv)
    Invariant(
        "K2-kv-foreign-tokens",
        "error",
        26,
        "a request's valid KV positions hold only its own tokens, never another request's",
        "ground truth",
        rules_kv.check_foreign_tokens,
        sides=("expected", "actual"),
        runners=ALL,
        message=lambda e: (
            f"{e.actual} valid KV positions of the request hold tokens written by "
            + (f"request {e.other_request!r}" if e.other_request else "another request")
            + ": KV it still held was written by another (a block handed over, or a write past the writer's own "
            "slots)"
        ),
    ),
    Invariant(
        "K3-kv-unowned-block",
        "error",
        27,
        "the worker runs a request on blocks the scheduler's KV manager holds for it, never a freed or another's",
        "ground truth",
        rules_kv.check_block_ownership,
        sides=("expected", "actual"),
        runners=ALL,
        message=lambda e: (
            f"the block table the worker ran the request with holds {e.actual} blocks the scheduler does not "
            "hold for it: "
            + (f"the first is request {e.other_request!r}'s" if e.other_request else "the first is free")
        ),
    ),
    Invariant(
        "K4-kv-write-unowned",
        "error",
        28,
        "a step writes KV only into blocks its request still holds",
        "ground truth",
        rules_kv.check_block_ownership,
        sides=("expected", "actual"),
        runners=ALL,
        message=lambda e: (
            f"the step wrote {e.actual} KV positions into blocks the request no longer holds ("
            + (f"request {e.other_request!r} holds the first" if e.other_request else "the first is free")
            + ")"
        ),
    ),
    Invariant(
        "K6-cache-hit-content",
        "error",
        9,
        "a prefix-cache hit serves only blocks that hold the KV of the tokens their hash names",
        "ground truth",
        rules_kv.check_cache_hits,
        sides=("expected", "actual"),
        runners=("v1", "v2"),
        message=lambda e: (
            f"the request's prefix-cache hit covers {e.expected} tokens, but only the first {e.actual} hold the KV "
            "of its own tokens: position "
            + f"{e.actual} holds "
            + (f"what request {e.other_request!r} wrote there" if e.other_request else "nothing written")
            + " (a cached block whose KV is not what its hash names: a rejected draft's, or a stale block's)"
        ),
    ),
    Invariant(
        "X12-padding-verified",
        "warning",
        36,
        "every draft slot verified holds a draft the drafter proposed (no padding verified as drafts)",
        "INV-X12",
        rules_waste.check_padding_verified,
        sides=(None, "actual"),
        message=lambda e: (
            f"the worker verified {e.actual} draft slots holding padding: the drafter proposed nothing "
            "for them after the step before (it skipped the request or proposed fewer than k), so the "
            "slots were booked and verified for nothing"
        ),
        runners=V1,
    ),
    # --- ground truth (rules_truth)
    Invariant(
        "K5-finished-state-kept",
        "error",
        29,
        "the worker drops a finished or aborted request's cached state and row at the step that announces it",
        "request lives",
        rules_kv.check_finished_state,
        sides=("expected", "actual"),
        message=lambda e: (
            "the worker still holds the request's cached state or batch row after the step that announced it "
            "finished (a resubmitted id would inherit it)"
        ),
    ),
    # --- Model Runner V2 (rules_mrv2)
    Invariant(
        "M1-device-computed",
        "error",
        30,
        "device num_computed_tokens = scheduler C minus the rejections of its steps in flight",
        "INV-M1",
        rules_mrv2.check_device_computed,
        sides=("expected", "actual"),
        runners=V2,
        message=lambda e: (
            f"the device num_computed_tokens the step runs from is {e.actual}, but the scheduler's C "
            f"{e.sched_num_computed_tokens} less {e.rejected_in_flight} rejected in flight is {e.expected}: "
            "the step computes from the wrong position"
        ),
    ),
    Invariant(
        "M1-device-advance",
        "error",
        31,
        "post_update advances the device count by the scheduled tokens less the rejections the scheduler applies",
        "INV-M1",
        rules_mrv2.check_device_computed,
        sides=("expected", "actual"),
        runners=V2,
        message=lambda e: (
            f"post_update took the device count from {e.worker_device_computed_before} to {e.actual}; the "
            f"scheduler's {e.sched_num_scheduled_tokens} tokens less {e.apply_num_rejected} rejected "
            f"make {e.expected}"
        ),
    ),
    Invariant(
        "M6-position-device-count",
        "error",
        46,
        "a step's input positions for a request start at the device count it runs from",
        "INV-M6",
        rules_mrv2.check_positions_from_device,
        sides=("expected", "actual"),
        runners=V2,
        message=lambda e: (
            f"the step's positions start at {e.actual}, but the device count it runs from is {e.expected}"
            + (
                f" (the CPU mirror holds {e.worker_cpu_computed})"
                if e.worker_cpu_computed is not None and e.worker_cpu_computed == e.actual
                else ""
            )
            + ": its tokens are embedded at the wrong positions and its KV written to the wrong slots"
        ),
    ),
    Invariant(
        "M2-cpu-mirror",
        "error",
        32,
        "the CPU mirror holds the scheduler's C (the device count plus the rejections in flight)",
        "INV-M2",
        rules_mrv2.check_cpu_mirror,
        sides=("expected", "actual"),
        runners=V2,
        message=lambda e: (
            f"the CPU mirror num_computed_tokens_np is {e.actual}, not the scheduler's C {e.expected}"
            + (f" (device {e.worker_device_computed_before})" if e.worker_device_computed_before is not None else "")
            + ": the CPU-side bounds MRV2 derives from it (seq_lens_cpu_upper_bound, prefill progress) are off"
        ),
    ),
    Invariant(
        "M3-draft-origin",
        "warning",
        33,
        "verified drafts were proposed for the request at its last step and follow its last token",
        "INV-M3",
        rules_mrv2.check_draft_origin,
        sides=("actual", None),
        runners=V2,
        message=_m3_message,
    ),
    Invariant(
        "M4-preempted-as-new",
        "error",
        34,
        "a preempted request's slot is freed, and its next run arrives new with all its tokens as prefill",
        "INV-M4",
        rules_mrv2.check_preempted_as_new,
        sides=("expected", "actual"),
        runners=V2,
        message=_m4_message,
    ),
    Invariant(
        "M5-slot-holder",
        "error",
        35,
        "a slot holds one request: none runs on a slot another request has taken since",
        "INV-M5",
        rules_mrv2.check_slot_holder,
        sides=("expected", "actual"),
        runners=V2,
        message=lambda e: (
            f"runs on slot {e.actual}, which request {e.holder!r} took"
            + (f" at step {e.taken_at}" if e.taken_at is not None else "")
            + ": two requests write one slot's state (its count, tokens, drafts)"
        ),
    ),
    # --- SGLang's scheduler (rules_sglang; G7 from the crash rule)
    Invariant(
        "G1-committed-past-allocated",
        "error",
        42,
        "kv_committed_len <= kv_allocated_len for a request not finished, after the scheduling and after "
        "process_batch_result",
        "INV-G1",
        rules_sglang.check_committed_within_allocated,
        sides=("actual", "expected"),
        message=_g1_message,
        runners=SGLANG,
    ),
    Invariant(
        "G2-committed-past-written",
        "error",
        43,
        "kv_committed_len never exceeds the KV-valid prefix the worker wrote, at the end of every iteration",
        "INV-G2",
        rules_sglang.check_committed_within_written,
        sides=("actual", "expected"),
        message=_g2_message,
        runners=SGLANG,
    ),
    Invariant(
        "G3-stale-result-applied",
        "error",
        39,
        "a result processed after its request finished or was retracted is skipped and changes nothing",
        "INV-G3",
        rules_sglang.check_stale_results,
        sides=("actual", "expected"),
        message=_g3_message,
        runners=SGLANG,
    ),
    Invariant(
        "G4-retracted-next-life",
        "error",
        40,
        "a retraction keeps the outputs; the next life starts with an extend over prompt + those outputs, "
        "nothing spliced",
        "INV-G4",
        rules_sglang.check_retracted_next_life,
        sides=("actual", "expected"),
        message=_g4_message,
        runners=SGLANG,
    ),
    Invariant(
        "G5-overcommit-at-finish",
        "warning",
        44,
        "a finish's radix insert keeps no KV that only a forward launched after the request finished computed",
        "INV-G5",
        rules_sglang.check_overcommit_at_finish,
        sides=("actual", "expected"),
        message=_g5_message,
        runners=SGLANG,
    ),
    Invariant(
        "G6-future-map-order",
        "error",
        41,
        "each decode or verify runs with the seq_len its latest earlier forward of the same life published",
        "INV-G6",
        rules_sglang.check_future_map_order,
        sides=("expected", "actual"),
        message=_g6_message,
        runners=SGLANG,
    ),
    # --- the run (rules_run)
    Invariant(
        "E1-engine-crash",
        "error",
        1,
        "the engine does not die (asserts, unexecutable outputs)",
        "engine",
        rules_run.check_crash,
        sides=(None, None),
        runners=ALL,
        scope="run",
        message=lambda e: f"the engine dies at step {e.step}: {e.outcome_message}",
    ),
    Invariant(
        "X5-negative-input-id",
        "error",
        0,
        "no negative id reaches the embedding",
        "INV-X5",
        rules_run.check_crash,
        sides=(None, "actual"),
        scope="run",
        message=lambda e: f"{e.outcome_message}: on a GPU a device-side assert, the engine dies",
    ),
    Invariant(
        "G7-sglang-own-check",
        "error",
        38,
        "SGLang's own invariant checker does not fail (it asserts inside SGLang's loop)",
        "INV-G7",
        rules_run.check_crash,
        sides=(None, "actual"),
        scope="run",
        message=lambda e: (
            f"SGLang's own invariant check failed at step {e.step}: {e.check} (sglang/srt/{e.check_source}"
            + (f", {e.check_function}" if e.check_function else "")
            + "); "
            f"SGLang says: {e.outcome_message}"
        ),
        runners=SGLANG,
    ),
    Invariant(
        "G8-delivered-past-max-tokens",
        "error",
        45,
        "the client receives at most max_tokens tokens of a request",
        "INV-G8",
        rules_sglang.check_delivered_within_max_tokens,
        sides=("expected", "actual"),
        scope="run",
        message=lambda e: (
            f"the client received {e.actual} tokens for max_tokens {e.expected}: SGLang's output streamer sent "
            "more than the finish let through (a finish that left finished_len unset sends every token "
            "output_ids has; a send cursor left behind sends some twice)"
        ),
        runners=SGLANG,
    ),
    Invariant(
        "G9-client-tokens",
        "error",
        48,
        "each token id a client receives is the token the worker sampled at that output's position",
        "INV-G9",
        rules_sglang.check_client_received_sampled,
        sides=("expected", "actual"),
        scope="run",
        message=lambda e: (
            f"the client's output token {e.output_index} is {e.actual}, but the worker sampled "
            + (f"{e.expected} there" if e.expected is not None else "nothing there")
            + f" ({e.client_tokens} tokens received): the client got a token out of its place (sent twice, "
            "skipped, spliced from another generation, or committed at the wrong index)"
        ),
        runners=SGLANG,
    ),
    Invariant(
        "G10-turn-past-computed",
        "error",
        49,
        "a streaming session's next turn starts its prefill no later than the KV its forwards computed",
        "INV-G10",
        rules_sglang.check_turn_starts_within_computed,
        sides=("expected", "actual"),
        message=lambda e: (
            f"the turn that began at step {e.turn_step} starts its prefill at position {e.actual}, but the "
            f"request's forwards computed KV up to position {e.expected} (step {e.frontier_step}'s forward): the "
            "session handed the turn positions no forward wrote as computed (the KV there is another token's, "
            "or nothing's)"
        ),
        runners=SGLANG,
    ),
    Invariant(
        "E2-run-incomplete",
        "error",
        2,
        "every request finishes: within the step limit, and none is held for good by an idle engine",
        "engine",
        rules_run.check_run_completes,
        sides=("status", "actual"),
        runners=ALL,
        scope="run",
        message=_e2_message,
    ),
)

BY_CODE: dict[str, Invariant] = {row.code: row for row in CATALOGUE}


def heads(rows: Iterable[Invariant] = CATALOGUE) -> tuple[Invariant, ...]:
    """The first row of each rule, in order: one per rule to run."""
    seen: set[int] = set()
    out = []
    for row in rows:
        if id(row.rule) not in seen:
            seen.add(id(row.rule))
            out.append(row)
    return tuple(out)


def rules_of(rows: Iterable[Invariant], scope: str) -> tuple[RuleFunction, ...]:
    """The rules to run for `rows` (each once, in catalogue order) of one scope."""
    return tuple(row.rule for row in heads(rows) if row.scope == scope)


#: One row per rule: the rule's own code (specreplay 0.1's INVARIANTS).
INVARIANTS: tuple[Invariant, ...] = heads()
#: The codes rules report besides their own: (code, severity, statement, source).
EXTRA_CODES: tuple[tuple[str, str, str, str], ...] = tuple(
    (row.code, row.severity, row.statement, row.source) for row in CATALOGUE if row not in INVARIANTS
)
SEVERITY: dict[str, str] = {row.code: row.severity for row in CATALOGUE}
RANK: dict[str, int] = {row.code: row.rank for row in CATALOGUE}


def all_codes() -> list[tuple[str, str, str, str]]:
    """Every code as (code, severity, statement, source), sorted by code."""
    return sorted((row.code, row.severity, row.statement, row.source) for row in CATALOGUE)


def about_the_worker_view(code: str) -> bool:
    """A code that compares with the worker's view (the cross-view X codes, MRV2's M codes, K5):
    not checked on a recording whose runner specreplay does not observe (UNOBSERVED_RUNNER)."""
    return code[0] in "XM" or code == "K5-finished-state-kept"


def not_on_mrv2(code: str) -> bool:
    """A code that does not run on a Model Runner V2 trace: about V1's runner state alone (or
    another engine's scheduler)."""
    return code in BY_CODE and "v2" not in BY_CODE[code].runners
