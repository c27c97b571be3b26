"""The invariant checker: scheduler view against worker view and ground truth, from a trace alone.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> **check** ->
workflows -> views -> cli. The checker reads only a trace's rows and metadata, so it works on any
trace, whatever recorded it. A violated invariant of the implementation under test is a finding,
never an exception.

Severity: error = the views or the ground truth disagree, a token is lost, duplicated or wrong,
or a negative id reaches the model; warning = work is wasted (draft slots verified with nothing
behind them, tokens executed that the scheduler did not book).

This module is the entry point (`check_trace`, `check_batches`; `check_report` adds the codes
that could not run, `unchecked_codes` gives those alone); the parts:

    catalogue.py     one row per code: severity, statement, source, rank, rule, message template,
                     and the runner families it is about (V1's, Model Runner V2's, both, SGLang's,
                     or every engine's)
    coverage.py      which codes need ground truth, and which a trace without it (or of the other
                     runner) leaves unchecked; another engine's codes are neither run nor listed
    limits.py        each request life's max_tokens per turn, from the workload the trace stores
    rules_*.py       the rule families: counters, drafts, batch, truth, lives, run, mrv2 (Model
                     Runner V2's slots, device count, CPU mirror and draft provenance) and sglang
                     (SGLang's scheduler: its KV lengths, stale results, retraction, the FutureMap)
    framework.py     `Checker`: streams row batches through the catalogue's rules, frame by frame
    frames.py        `Frame` and the column loading: numpy columns by the trace's column names
    findings.py      `Finding`: the evidence (expected, actual, life, detail) and the message

The row-by-row statement of every rule lives in tests/replay/check/rowwise_checker.py, and a test holds
the two to the same findings on every scenario, implementation and many mutated traces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from specreplay.replay.check import coverage
from specreplay.replay.check.catalogue import CATALOGUE, EXTRA_CODES, INVARIANTS, RANK, SEVERITY, Invariant, all_codes
from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import LOOKBACK, NEEDED, Frame
from specreplay.replay.check.framework import SAMPLED_COLUMNS, Checker
from specreplay.replay.check.limits import embedded_prompts, max_tokens_by_life
from specreplay.traces import schema
from specreplay.traces.families import family_name
from specreplay.traces.trace import Trace

#: Within one step and request, the order of codes (the catalogue's `rank`).
_RANK = RANK

__all__ = [
    "CATALOGUE",
    "EXTRA_CODES",
    "INVARIANTS",
    "LOOKBACK",
    "NEEDED",
    "SEVERITY",
    "CheckReport",
    "Checker",
    "Finding",
    "Frame",
    "Invariant",
    "all_codes",
    "check_batches",
    "check_report",
    "check_trace",
    "columns_needed",
    "unchecked_codes",
]


@dataclass(frozen=True)
class CheckReport:
    """What the checker says of one trace."""

    findings: list[Finding]  # sorted by step, request, code
    # The codes that could not run: the ground truth they compare with is null in every row (a
    # live engine's trace has no oracle). No finding of theirs means "not checked", not "agree".
    unchecked: list[str]


def columns_needed(header) -> tuple[str, ...]:
    """The columns the checker reads from a trace with this header: `NEEDED`, and the worker's
    sampled tokens with their positions where the outcome holds the ids each client received
    (G9 compares the two)."""
    outcome = getattr(header, "outcome", None)
    if getattr(outcome, "engine_output_ids", None) is None:
        return NEEDED
    return schema.in_schema_order({*NEEDED, *SAMPLED_COLUMNS})


def check_trace(trace: Trace, batch_rows: int = 1 << 20) -> list[Finding]:
    """Every invariant over an in-memory trace; findings sorted by step, request, code."""
    return check_batches(trace, trace.table.select(list(columns_needed(trace))).to_batches(max_chunksize=batch_rows))


def check_batches(header, batches: Iterable[pa.Table | pa.RecordBatch]) -> list[Finding]:
    """Every invariant over a trace that arrives in batches in step order (`TraceFile.batches()`):
    memory is bounded by the batch size. `header` gives the config and outcome."""
    return check_report(header, batches).findings


def check_report(header, batches: Iterable[pa.Table | pa.RecordBatch]) -> CheckReport:
    """`check_batches`, and in the same pass the codes the trace gave no ground truth to check."""
    checker = Checker(
        header.config,
        header.outcome,
        drafter=header.impl.drafter,
        limits=max_tokens_by_life(header.workload),
        runner_family=header.impl.runner_family,
        embedded=embedded_prompts(header.workload),
    )
    for batch in batches:
        checker.feed(batch)
    return CheckReport(checker.findings(), checker.unchecked())


def unchecked_codes(trace) -> list[str]:
    """The codes that cannot run on `trace` (a `Trace`, or a `TraceFile`: its rows are read):
    every ground-truth column they compare with is null in every row. Catalogue order; empty
    for a trace recorded with ground truth (the reference runner's, or vLLM's scheduler fed by it)."""
    seen: set[str] = set()
    for batch in trace.batches(columns=coverage.GROUND_TRUTH):
        seen |= coverage.columns_with_values(batch)
    return coverage.unchecked(
        (row.code for row in CATALOGUE),
        seen,
        limits_known=bool(max_tokens_by_life(trace.workload)),
        runner_family=family_name(trace.impl),
    )
