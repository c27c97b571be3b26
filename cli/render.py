"""Rendering of findings, stories and trace summaries with rich (terminal) or JSON.

Where it sits: the last stage of diff. Takes data (findings, traces) and prints; computes nothing
that a library function could return.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa
from rich.table import Table

from specreplay.replay.check.findings import Finding, verdict
from specreplay.traces.families import EngineLine, FamilyTraits, WorkerView, traits
from specreplay.traces.io import TraceFile
from specreplay.traces.trace import Trace

EXAMPLES_PER_CODE = 3


def findings_json(findings: list[Finding], extra: dict[str, Any] | None = None, verdict_text: str | None = None) -> str:
    # The finding keys `diff --json` documents (docs/checker.md; tests/cli pins them), and the request's
    # life (null where no request), whether or not its id has several. The other evidence fields
    # (expected, actual, detail) that Finding.to_dict() adds stay out of this output.
    doc: dict[str, Any] = {
        "verdict": verdict_text or verdict(findings),
        "findings": [f.to_dict(evidence=False) | {"life": f.life} for f in findings],
    }
    if extra:
        doc.update(extra)
    return json.dumps(doc, indent=2, default=str)


def unchecked_note(unchecked: list[str], runner_family: str | None = None) -> str:
    """What a report says of the codes a trace gave no ground truth to check, or no requests'
    limits (its workload defines no request: S9 needs their max_tokens), or that are about V1's
    runner on a Model Runner V2 trace, or a worker view that was not recorded (`runner_family`,
    the trace's); "" when all ran."""
    from specreplay.replay.check.coverage import notes

    return "; ".join(notes(unchecked, runner_family))


def findings_lines(findings: list[Finding], trace_path: str | None = None) -> list[str]:
    """A handful of examples per code, then a count of the rest; one finding per line, and with
    `trace_path` the `specreplay show` command that draws it."""
    lines: list[str] = []
    by_code: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_code[f.code].append(f)
    for code, items in sorted(by_code.items(), key=lambda kv: (kv[1][0].step, kv[0])):
        for f in items[:EXAMPLES_PER_CODE]:
            lines.append(
                f"  {f.severity:7} {f.code}  step {f.step}  request {f.request_label}  {f.field}: "
                f"scheduler {_v(f.scheduler)} / worker {_v(f.worker)}"
            )
            lines.append(f"          {f.message}")
            if trace_path is not None and f.request_id is not None:
                lines.append(
                    f"          show: specreplay show {trace_path} --request {f.request_id} "
                    f"--steps {max(1, f.step - 4)}:{f.step + 4}"
                )
        if len(items) > EXAMPLES_PER_CODE:
            lines.append(f"          ... and {len(items) - EXAMPLES_PER_CODE} more {code}")
    return lines


def _v(value: Any) -> str:
    return "-" if value is None else str(value)


#: The scheduler's side of a request's story, the same on every runner.
_SCHED_STORY = (
    ("step", "m"),
    ("sched_kind", "kind"),
    ("sched_skip", "skip"),
    ("sched_num_scheduled_tokens", "n"),
    ("sched_num_draft_slots", "k"),
    ("sched_num_computed_tokens", "C"),
    ("sched_num_output_placeholders", "P"),
    ("sched_num_tokens", "T"),
)
STORY_COLUMNS = _SCHED_STORY + (
    ("worker_in_prev_map", "pm"),
    ("worker_cached_drafts", "dr"),
    ("worker_num_scheduled_tokens", "wn"),
    ("worker_num_computed_tokens", "wC"),
    ("worker_num_accepted", "acc"),
    ("truth_num_computed_tokens", "KV"),
)


#: The story of a request on a Model Runner V2 trace: MRV2's slot view in place of V1's batch
#: (traces/schema.py, "worker (MRV2)").
STORY_COLUMNS_MRV2 = _SCHED_STORY + (
    ("worker_slot", "slot"),
    ("worker_query_len", "q"),
    ("worker_device_computed_before", "dC"),
    ("worker_device_computed_after", "dC'"),
    ("worker_cpu_computed", "cpu"),
    ("worker_draft_proposed_step", "from"),
    ("worker_draft_base", "base"),
    ("worker_num_accepted", "acc"),
    ("worker_num_rejected", "rej"),
)
#: The story of a request on an SGLang trace: SGLang's KV lengths on both sides (traces/schema.py,
#: "(SGLang)") in place of vLLM's counters of the worker.
STORY_COLUMNS_SGLANG = _SCHED_STORY + (
    ("sched_kv_committed_len", "c"),
    ("sched_kv_allocated_len", "a"),
    ("worker_seq_len", "wL"),
    ("worker_num_scheduled_tokens", "wn"),
    ("worker_num_accepted", "acc"),
    ("worker_new_seq_len", "wL'"),
    ("apply_kv_committed_len", "c'"),
    ("truth_num_computed_tokens", "KV"),
)
#: What each worker view's story columns mean (traces/families.py: a family's `view`).
_STORY_TITLES = {
    WorkerView.PERSISTENT_BATCH: (
        "C P T: scheduler before the step; pm: in the worker's prev map; dr: drafts cached for it; wn: tokens "
        "the worker ran; wC: worker after correction; KV: valid in cache"
    ),
    WorkerView.SLOTS: (
        "C P T: scheduler before the step; slot: its slot in MRV2's req_states; q: query length run; dC dC': "
        "device num_computed_tokens before / after post_update; cpu: the CPU mirror; from: the step that proposed "
        "the drafts it verified; base: the device count they follow; acc rej: accepted, rejected"
    ),
    WorkerView.SGLANG_ROWS: (
        "C: kv_committed_len before the iteration; T: seqlen; c a: committed, allocated after its scheduling; "
        "wL: the seq_len the worker ran with; wn: tokens it ran; acc: drafts accepted; wL': the seq_len it "
        "published; c': committed after the apply; KV: valid in cache"
    ),
}


#: The story's (column, label) pairs for each worker view.
_STORY_COLUMNS = {
    WorkerView.PERSISTENT_BATCH: STORY_COLUMNS,
    WorkerView.SLOTS: STORY_COLUMNS_MRV2,
    WorkerView.SGLANG_ROWS: STORY_COLUMNS_SGLANG,
}


def story_columns(family: FamilyTraits | None = None) -> tuple[tuple[str, str], ...]:
    """The story's (column, label) pairs for a trace of runner family `family` (its traits;
    None: the default family's)."""
    return _STORY_COLUMNS[(family or traits(None)).view]


def story_table(
    rows: pa.Table, request_id: str, upto_step: int, family: FamilyTraits | None = None, steps_before: int = 8
) -> Table:
    """The request's rows over the steps up to a finding: what each side did, in the worker view
    of the trace's runner family. `rows` holds at least those rows and `story_columns(family)`
    (`TraceFile.rows_of`, or a whole trace's table)."""
    from rich import box

    family = family or traits(None)
    columns = story_columns(family)
    table = Table(
        title=f"request {request_id!r}{family.shown_as} up to step {upto_step} ({_STORY_TITLES[family.view]})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
    )
    for _, label in columns:
        table.add_column(label, justify="right", no_wrap=True)
    steps = rows["step"].to_pylist()
    rids = rows["request_id"].to_pylist()
    shown = [i for i, (s, r) in enumerate(zip(steps, rids)) if r == request_id and s <= upto_step][-steps_before:]
    cols = {name: rows[name].to_pylist() for name, _ in columns}
    for i in shown:
        table.add_row(
            *[
                _SHORT.get(cols[name][i], _cell(cols[name][i]))
                if name in ("sched_kind", "sched_skip")
                else _cell(cols[name][i])
                for name, _ in columns
            ]
        )
    return table


_SHORT = {
    "unscheduled": "-",
    "reentering": "REENTRY",
    "cached": "cached",
    "budget": "budget",
    "max_tokens": "maxtok",
    "no_tokens": "notok",
    "prefill": "prefill",
    "preempted": "preempt",
    "waiting": "wait",
    "finished": "done",
    "resumed": "resume",
    "": "",
}


def _cell(value: Any) -> str:
    if value is None:
        return "."
    if value is True:
        return "y"
    if value is False:
        return "n"
    return str(value)


def code_counts(findings: list[Finding]) -> str:
    counts = Counter(f.code for f in findings)
    return ", ".join(f"{code} x{n}" for code, n in sorted(counts.items()))


def trace_header(trace: Trace | TraceFile, path: str) -> str:
    cfg = trace.config
    return (
        f"{path}: {trace.workload.name or '?'} via {trace.impl_name} "
        f"({'async' if cfg.async_scheduling else 'sync'}, budget {cfg.max_num_batched_tokens}, "
        f"k={cfg.num_spec_tokens}), {trace.num_steps} steps, {trace.num_rows} rows, "
        f"outcome {trace.outcome.status}"
    )


def _matrix_rows(cells: list[Any]) -> tuple[list[tuple[str, str]], list[tuple[Any, dict[tuple[str, str], Any]]]]:
    """The columns, (release, runner) with releases oldest first and each release's runners in
    registry order (those it has), and per known bug (in order) its cells by column."""
    from specreplay.replay.workloads.known_bugs import KNOWN_BUGS

    vllm = [c for c in cells if traits(c.runner).line is EngineLine.VLLM]
    versions = list(dict.fromkeys(c.version for c in vllm))
    runners = list(dict.fromkeys(c.runner for c in vllm))
    measured = {(c.version, c.runner) for c in vllm}  # a release without a runner family has no column
    columns = [(v, r) for v in versions for r in runners if (v, r) in measured]
    columns += list(dict.fromkeys((c.version, c.runner) for c in cells if traits(c.runner).line is not EngineLine.VLLM))
    by_bug: dict[str, dict[tuple[str, str], Any]] = defaultdict(dict)
    for c in cells:
        by_bug[c.bug][(c.version, c.runner)] = c
    return columns, [(bug, by_bug[bug.key]) for bug in KNOWN_BUGS if bug.key in by_bug]


def _measured_on(cells: list[Any]) -> str:
    seen = dict.fromkeys(
        f"{_column_name(c.version, c.runner)}: {c.measured_on}" for c in cells if c.verdict != "does not apply"
    )
    return "measured on " + "; ".join(seen)


def bug_matrix_markdown(cells: list[Any]) -> str:
    """The bug matrix (docs/vllm-releases.md, README): one row per known failure, one verdict
    column per vLLM release and runner family (v1: the V1 GPUModelRunner; v2: Model Runner V2),
    and SGLang's where it was measured."""
    columns, rows = _matrix_rows(cells)
    lines = [
        "| failure | workload | decided by | " + " | ".join(_column_name(v, r) for v, r in columns) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in columns) + " |",
    ]
    for bug, by_column in rows:
        verdicts = " | ".join(by_column[c].verdict if c in by_column else "" for c in columns)
        lines.append(f"| {bug.title} | `{bug.key}` | {bug.decided_by} | {verdicts} |")
    return "\n".join(lines) + "\n\n" + _measured_on(cells)


def _column_name(version: str, runner: str) -> str:
    """A matrix column: a vLLM release and runner family (`0.32.0 v1`), or SGLang's (`sglang 0.5.23`)."""
    return f"{version} {runner}" if traits(runner).line is EngineLine.VLLM else f"{runner} {version}"


def bug_matrix_table(cells: list[Any]) -> Table:
    columns, rows = _matrix_rows(cells)
    table = Table(title="known failures x engine release x runner", caption=_measured_on(cells), show_lines=True)
    table.add_column("failure (workload)")
    table.add_column("decided by")
    for v, r in columns:
        table.add_column(_column_name(v, r))
    for bug, by_column in rows:
        verdicts = []
        for column in columns:
            cell = by_column.get(column)
            verdicts.append(f"{cell.verdict}\n{cell.evidence}" if cell else "")
        table.add_row(f"{bug.title} ({bug.key})", bug.decided_by, *verdicts)
    return table
