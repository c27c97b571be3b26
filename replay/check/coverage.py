"""Coverage: which codes a trace lets the checker run, and which it cannot for want of ground truth.

Where it sits: inside check, beside the catalogue. A few rules compare a view against ground
truth: the reference runner's KV cache and the workload's expected tokens, kept in the columns the
schema documents as "truth: ..." (`GROUND_TRUTH`). A live vLLM engine's KV cache is not read, so
its trace holds the KV columns null in every row (`KV_TRUTH`'s codes: S3, X2-worker-kv-position,
K1-K4); its tokens have ground truth when the run was forced (families/vllm/forced_logits.py: the
engine samples the oracle's tokens and the scheduler observer counts wrong ones, T1), not when it
was not (real weights, an attached user's engine). On such a trace those rules find nothing, not
because the views agree with the truth but because there is none to compare with; `unchecked`
names their codes, so that every report says what it did not check instead of a bare "ok" (and
on a forced live trace, that T1 ran).

A code is unchecked when every ground-truth column its rule reads (`TRUTH_INPUTS`) is null in
every row of the trace. A trace whose rows carry truth only in part is checked where they do.

The same holds for the requests' limits: the wasted-step rule needs each life's max_tokens,
which the checker reads from the trace's workload (limits.py). A trace whose workload defines no
request leaves that rule's code (`LIMIT_INPUTS`) unchecked.

And for the runner: a few codes are about V1's runner state (its persistent batch, cached drafts,
CPU counts: catalogue `runners`), which a Model Runner V2 trace does not have; on such a trace
they are listed unchecked too, and MRV2's own codes (rules_mrv2.py) run in their place. Another
engine's codes are neither run nor listed: on an SGLang trace (runner family `sglang`) vLLM's
scheduler codes are about a scheduler that did not run, and on a vLLM trace SGLang's G codes
(rules_sglang.py) are; the codes both engines' rows fill (tokens, KV truth, the batch, the run:
catalogue `ALL`) run on both.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from specreplay.replay.check.catalogue import BY_CODE, CATALOGUE, about_the_worker_view, not_on_mrv2
from specreplay.traces import schema
from specreplay.traces.families import BASELINE_FAMILY, DEFAULT_FAMILY, EngineLine, traits
from specreplay.traces.header import UNOBSERVED_RUNNER

#: The columns that hold ground truth, as the schema documents them ("truth: ...").
GROUND_TRUTH: tuple[str, ...] = tuple(name for name, doc in schema.DESCRIPTIONS.items() if doc.startswith("truth:"))

#: The ground-truth columns each code's rule compares with (rules_counters.check_computed_tokens,
#: rules_truth); every other code reads none. Several codes share a rule but not its inputs: the
#: computed-tokens rule checks X2-sched-worker-computed without truth, S3 against it.
TRUTH_INPUTS: dict[str, tuple[str, ...]] = {
    "S3-scheduler-computed-tokens": ("truth_num_computed_tokens",),
    "X2-worker-kv-position": ("truth_num_computed_tokens",),
    "T1-wrong-token": ("apply_token_mismatches",),
    "K1-kv-content": ("truth_kv_ok",),
    "K2-kv-foreign-tokens": ("truth_kv_foreign_positions",),
    "K3-kv-unowned-block": ("truth_kv_unowned_blocks",),
    "K4-kv-write-unowned": ("truth_kv_unowned_writes",),
    "K6-cache-hit-content": ("truth_cache_hit_valid",),
    "X12-padding-verified": ("truth_unfilled_draft_slots",),
    "G2-committed-past-written": ("truth_kv_after",),
    "G5-overcommit-at-finish": ("truth_num_computed_tokens",),
}
#: The codes whose ground truth is the reference drafter's own record of what it proposed: a live
#: engine's runner keeps none, forced or not.
DRAFTER_TRUTH: tuple[str, ...] = ("X12-padding-verified",)
#: The codes whose ground truth a live engine's trace never has, forced or not: the KV cache's (the
#: reference runner's record of every slot; a live engine's KV cache is not read) and the
#: drafter's. T1's truth is the oracle's tokens, which a forced live run has
#: (families/vllm/forced_logits.py).
KV_TRUTH: tuple[str, ...] = tuple(code for code in TRUTH_INPUTS if code != "T1-wrong-token")


def kv_truth_codes(runner_family: str) -> tuple[str, ...]:
    """`KV_TRUTH`'s codes that run on a trace of `runner_family` (the G codes on SGLang's, the
    others on vLLM's): what a live or attached trace of that family leaves unchecked for want of
    the KV cache's and the drafter's ground truth."""
    return tuple(code for code in KV_TRUTH if runner_family in BY_CODE[code].runners)


#: The codes whose rule needs the requests' max_tokens (limits.py): unchecked without them.
LIMIT_INPUTS: tuple[str, ...] = ("S9-step-past-max-tokens", "G8-delivered-past-max-tokens")
assert set(TRUTH_INPUTS) <= set(BY_CODE), "TRUTH_INPUTS names a code the catalogue lacks"
assert set(LIMIT_INPUTS) <= set(BY_CODE), "LIMIT_INPUTS names a code the catalogue lacks"
assert {c for cols in TRUTH_INPUTS.values() for c in cols} <= set(GROUND_TRUTH), "TRUTH_INPUTS: not a truth column"


def columns_with_values(batch: pa.Table | pa.RecordBatch) -> set[str]:
    """The ground-truth columns of `batch` that hold at least one value (absent ones hold none)."""
    names = set(batch.schema.names)
    return {name for name in GROUND_TRUTH if name in names and batch.column(name).null_count < batch.num_rows}


def unchecked(
    codes: Iterable[str], with_values: set[str], limits_known: bool = True, runner_family: str = DEFAULT_FAMILY
) -> list[str]:
    """The codes of `codes` that could not run: every ground-truth column they read is in none
    of the trace's rows (`with_values`: the columns that hold a value somewhere), or they need
    the requests' limits and the trace's workload gave none (`limits_known`), or they are about
    V1's runner state and the trace recorded another runner (`runner_family`, e.g. v2: Model
    Runner V2). A V1 trace does not list the codes of other runners: they are not about it; nor
    does a trace of one engine list the other engine's codes (VLLM_RUNNERS). Catalogue order."""
    wanted = set(codes)
    out = []
    blind = runner_family == UNOBSERVED_RUNNER
    runner_family = BASELINE_FAMILY if blind else runner_family  # what needs no worker view: as on V1
    for row in CATALOGUE:
        if row.code not in wanted:
            continue
        if blind and (about_the_worker_view(row.code) or BASELINE_FAMILY not in row.runners):
            out.append(row.code)  # no worker view was recorded: every code that compares with it
            continue
        if runner_family not in row.runners:
            baseline_code = BASELINE_FAMILY in row.runners and runner_family != BASELINE_FAMILY
            if baseline_code and traits(runner_family).line is EngineLine.VLLM:
                out.append(row.code)
            continue
        if (TRUTH_INPUTS.get(row.code) and not with_values.intersection(TRUTH_INPUTS[row.code])) or (
            row.code in LIMIT_INPUTS and not limits_known
        ):
            out.append(row.code)
    return out


def notes(unchecked_codes: list[str], runner_family: str | None = None) -> list[str]:
    """What a report says of the codes it could not run, one note per reason (empty: all ran):
    no ground truth, no requests' limits in the workload, about V1's runner on an MRV2 trace, or
    (`runner_family` UNOBSERVED_RUNNER) about a worker view that was not recorded."""
    if runner_family == UNOBSERVED_RUNNER:
        worker = [code for code in unchecked_codes if about_the_worker_view(code)]
        rest = notes([code for code in unchecked_codes if code not in worker])
        return [
            f"worker view not recorded (a runner specreplay does not observe): {len(worker)} codes not checked"
        ] + rest
    runner = for_the_runner(unchecked_codes)
    limits = [code for code in unchecked_codes if code in LIMIT_INPUTS and code not in runner]
    truth = [code for code in unchecked_codes if code not in LIMIT_INPUTS and code not in runner]
    if truth and all(code in KV_TRUTH for code in truth):
        # A forced live trace: its tokens have the oracle's ground truth, its KV cache and drafter none.
        out = [f"no KV ground truth (tokens checked against the oracle, T1): {', '.join(truth)} not checked"]
    else:
        out = [f"no ground truth: {', '.join(truth)} not checked"] if truth else []
    out += [f"no max_tokens in the workload: {', '.join(limits)} not checked"] if limits else []
    out += [f"V1 runner state, not Model Runner V2's: {', '.join(runner)} not checked"] if runner else []
    return out


def for_the_runner(unchecked_codes: list[str]) -> list[str]:
    """The codes of a trace's unchecked list that did not run because it recorded Model Runner V2.
    A V1-runner code that reads ground truth (X12: the V1 reference drafter's record) is unchecked
    on a V1 trace without truth too; it is the runner's only where the trace is MRV2's, which the
    V1-runner codes that read no truth, unchecked on MRV2 traces alone, say."""
    mrv2 = any(not_on_mrv2(code) and code not in TRUTH_INPUTS for code in unchecked_codes)
    return [code for code in unchecked_codes if not_on_mrv2(code) and (mrv2 or code not in TRUTH_INPUTS)]


def why(code: str, unchecked_codes: list[str] | None = None) -> str:
    """Why one code was not checked, in a few words (`unchecked_codes`: the trace's whole list,
    which tells an MRV2 trace's runner codes from a V1 trace's missing truth)."""
    if code in for_the_runner(unchecked_codes if unchecked_codes is not None else [code]):
        return "the trace recorded Model Runner V2; the code is about V1's runner state"
    if code in DRAFTER_TRUTH:
        return "the trace holds no ground truth for the drafter (only the reference runner records what it proposed)"
    if code in KV_TRUTH:
        return "the trace holds no ground truth for the KV cache (a live engine's is not read)"
    return "the workload gives no max_tokens" if code in LIMIT_INPUTS else "the trace holds no ground truth"
