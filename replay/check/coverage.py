"""Coverage: which codes a trace lets the checker run, and which it cannot for want of ground truth.

Where it sits: inside check, beside the catalogue. A few rules compare a view against ground
truth: the reference runner's KV cache and the workload's expected tokens, kept in the columns the
schema documents as "truth: ..." (`GROUND_TRUTH`). A live vLLM engine has no oracle, so its trace
holds those columns null in every row (and so may a trace recorded from any other engine). On such
a trace those rules find nothing, not because the views agree with the truth but because there is
none to compare with; `unchecked` names their codes, so that every report says what it did not
check instead of a bare "ok".

A code is unchecked when every ground-truth column its rule reads (`TRUTH_INPUTS`) is null in
every row of the trace. A trace whose rows carry truth only in part is checked where they do.

The same holds for the requests' limits: the wasted-step rule needs each life's max_tokens,
which the checker reads from the trace's workload (limits.py). A trace whose workload defines no
request leaves that rule's code (`LIMIT_INPUTS`) unchecked.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from specreplay.replay.check.catalogue import BY_CODE, CATALOGUE
from specreplay.traces import schema

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
}
#: The codes whose rule needs the requests' max_tokens (limits.py): unchecked without them.
LIMIT_INPUTS: tuple[str, ...] = ("S9-step-past-max-tokens",)
assert set(TRUTH_INPUTS) <= set(BY_CODE), "TRUTH_INPUTS names a code the catalogue lacks"
assert set(LIMIT_INPUTS) <= set(BY_CODE), "LIMIT_INPUTS names a code the catalogue lacks"
assert {c for cols in TRUTH_INPUTS.values() for c in cols} <= set(GROUND_TRUTH), "TRUTH_INPUTS: not a truth column"


def columns_with_values(batch: pa.Table | pa.RecordBatch) -> set[str]:
    """The ground-truth columns of `batch` that hold at least one value (absent ones hold none)."""
    names = set(batch.schema.names)
    return {name for name in GROUND_TRUTH if name in names and batch.column(name).null_count < batch.num_rows}


def unchecked(codes: Iterable[str], with_values: set[str], limits_known: bool = True) -> list[str]:
    """The codes of `codes` that could not run: every ground-truth column they read is in none
    of the trace's rows (`with_values`: the columns that hold a value somewhere), or they need
    the requests' limits and the trace's workload gave none (`limits_known`). Catalogue order."""
    wanted = set(codes)
    return [
        row.code
        for row in CATALOGUE
        if row.code in wanted
        and (
            (TRUTH_INPUTS.get(row.code) and not with_values.intersection(TRUTH_INPUTS[row.code]))
            or (row.code in LIMIT_INPUTS and not limits_known)
        )
    ]
