"""The timeline model: per request, per step, what the scheduler did and what the worker did.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> **views** -> cli, for people. `build_timeline` reads a trace's rows (streamed, only the
requests and steps asked for) and its findings, and returns lanes of short cells: the scheduler's
state at each step (scheduled n tokens with k draft slots, new, re-entering, resumed, skipped by the
budget or the max-tokens rule, waiting, preempted, finished), the worker's (in the batch with what
it executed, or not), the findings that fire there and, on demand, a counter on both sides. A
Model Runner V2 trace (worker view `WorkerView.SLOTS`, traces/families.py) has no persistent
batch to show: its worker lane reads MRV2's own columns (traces/schema.py, "worker (MRV2)"), with two lanes more per
request, the slot it holds in `req_states` and where the drafts it verified came from (the step
whose propose wrote them, and whether they were written for it, at the position it is at).
`cli/show.py` draws it with rich; `replay/perfetto.py` exports the same rows as trace events.
Nothing here prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specreplay.traces.families import DEFAULT_FAMILY, WorkerView, family_name, traits

#: Cell glyphs, explained in the legend. A cell is at most `CELL` characters.
CELL = 5
LEGEND = (
    ("1+3", "scheduled: 1 token plus 3 draft slots (a decode); 16: 16 tokens, no drafts"),
    ("N", "new (first scheduling)"),
    ("R", "re-entering the batch (running, not scheduled the step before)"),
    ("U", "resumed from preemption"),
    ("b", "skipped: budget spent before it"),
    ("m", "skipped: max-tokens rule"),
    ("0", "visited, nothing to schedule"),
    ("w", "waiting"),
    ("P", "preempted in this step"),
    ("p", "preempted, waiting to resume"),
    ("F", "finished"),
    (".", "worker: not in the batch"),
    ("!", "worker: fed negative draft ids (placeholders)"),
    ("^", "a control event changed it just before the step (abort, cache reset, resubmission, streaming turn)"),
    ("Z S X", "engine lane: pause, resume (start), prefix-cache reset"),
)
#: What a Model Runner V2 trace's lanes add (its worker cells carry where their drafts came from).
LEGEND_MRV2 = (
    ("slot", "lane: the request's slot in MRV2's req_states; (5): slot 5 kept while out of the batch"),
    ("from", "lane: @m, the step whose propose wrote the drafts it verified"),
    ("?", "worker: verified draft slots nothing was proposed into since it took its slot"),
    ("x", "worker: verified drafts proposed for another request (a reused slot)"),
    ("~", "worker: verified drafts proposed at another position than the one it is at"),
)
#: What an SGLang trace's cells add (its scheduler runs a prefill batch before any decode).
LEGEND_SGLANG = (("f", "skipped: the iteration ran a prefill batch, which SGLang schedules first"),)
#: The glyphs each worker view adds to the common legend.
_VIEW_LEGEND = {WorkerView.PERSISTENT_BATCH: (), WorkerView.SLOTS: LEGEND_MRV2, WorkerView.SGLANG_ROWS: LEGEND_SGLANG}

_COLUMNS = (
    "step",
    "request_id",
    "sched_status",
    "sched_kind",
    "sched_skip",
    "sched_num_scheduled_tokens",
    "sched_num_draft_slots",
    "sched_preempted",
    "worker_row",
    "worker_num_scheduled_tokens",
    "worker_num_draft_slots",
    "worker_draft_ids",
    "step_event",
    "sched_event",
)
#: The MRV2 worker columns its lanes read (null on V1 rows; absent from traces before schema v5).
MRV2_COLUMNS = (
    "worker_slot",
    "worker_device_computed_before",
    "worker_draft_proposed_step",
    "worker_draft_proposed_for",
    "worker_draft_base",
    "worker_new_life",
)
MAX_DEFAULT_REQUESTS = (
    12  # without --request: the first requests with findings (else the first seen), at most this many
)
#: Without --steps, a trace longer than this shows a window around its first finding.
DEFAULT_WINDOW = 64

#: --field choices: (scheduler column, worker column).
FIELDS = {
    "num_computed_tokens": ("sched_num_computed_tokens", "worker_num_computed_tokens"),
    "num_output_placeholders": ("sched_num_output_placeholders", None),
    "num_scheduled_tokens": ("sched_num_scheduled_tokens", "worker_num_scheduled_tokens"),
    "num_draft_slots": ("sched_num_draft_slots", "worker_num_draft_slots"),
    "num_output_tokens": ("sched_num_output_tokens", "worker_num_output_tokens"),
    "num_tokens": ("sched_num_tokens", None),
    "kv_valid": ("truth_num_computed_tokens", "truth_kv_after"),
}
#: On a Model Runner V2 trace: the worker's count is the device tensor's, read when the step ran
#: (`worker_device_computed_before`); MRV2 keeps no per-request output count of its own.
FIELDS_MRV2 = FIELDS | {
    "num_computed_tokens": ("sched_num_computed_tokens", "worker_device_computed_before"),
    "num_output_tokens": ("sched_num_output_tokens", None),
}
#: Lane labels for the fields (the story table's letters).
FIELD_LABELS = {
    "num_computed_tokens": "C",
    "num_output_placeholders": "P",
    "num_scheduled_tokens": "n",
    "num_draft_slots": "k",
    "num_output_tokens": "out",
    "num_tokens": "T",
    "kv_valid": "KV",
}


@dataclass
class Cell:
    text: str
    style: str = ""  # a semantic name the renderer maps to a colour: ok, new, reentry, skip, bad, ...


@dataclass
class Lane:
    request_id: str
    side: str  # "sched" | "worker" | "findings" | "sched FIELD" | "worker FIELD"
    cells: dict[int, Cell] = field(default_factory=dict)


@dataclass
class Timeline:
    first_step: int
    last_step: int
    lanes: list[Lane]
    findings: dict[tuple[int, str], list[Any]]  # (step, request) -> findings
    requests_in_range: int = 0  # requests with rows in the steps shown (lanes show at most MAX_DEFAULT_REQUESTS)
    runner_family: str = DEFAULT_FAMILY  # the runner family whose worker view the lanes show


def runner_family_of(trace) -> str:
    """The runner family whose worker view a trace holds (traces before schema v5 name none: V1's)."""
    return family_name(trace.impl)


def shows_slots(family: str) -> bool:
    """Whether the family's worker view is MRV2's slots (lanes for the slot and the drafts' origin)."""
    return traits(family).view is WorkerView.SLOTS


def legend(family: str) -> tuple[tuple[str, str], ...]:
    """The glyphs a timeline of that runner family's trace uses."""
    return LEGEND + _VIEW_LEGEND[traits(family).view]


def amount(n: int, k: int) -> str:
    """n scheduled tokens of which k are draft slots: '1+3', or '16' without drafts."""
    return f"{n - k}+{k}" if k else str(n)


def sched_cell(row: dict[str, Any]) -> Cell:
    cell = _sched_cell(row)
    if row.get("sched_event"):
        cell.text = ("^" + cell.text)[:CELL]
    return cell


def engine_cell(step_event: str) -> Cell:
    """The engine lane: Z pause, S resume, X prefix-cache reset, in the order they landed."""
    letters = "".join(
        "Z"
        if e.startswith("pause(")
        else "S"
        if e == "resume"
        else "X"
        if "reset_prefix_cache" in e or e.startswith("pause: clear")
        else "?"
        for e in step_event.split("; ")
    )
    return Cell(letters[:CELL], "warn")


def _sched_cell(row: dict[str, Any]) -> Cell:
    n, k = row["sched_num_scheduled_tokens"], row["sched_num_draft_slots"]
    if n:
        kind = row["sched_kind"]
        prefix, style = {"new": ("N", "new"), "reentering": ("R", "reentry"), "resumed": ("U", "new")}.get(
            kind, ("", "ok")
        )
        return Cell((prefix + amount(n, k))[:CELL], style)
    if row["sched_preempted"]:
        return Cell("P", "bad")
    status, skip = row["sched_status"], row["sched_skip"]
    if status == "finished":
        return Cell("F", "dim")
    if status == "preempted":
        return Cell("p", "skip")
    return Cell(
        {"budget": "b", "max_tokens": "m", "no_tokens": "0", "waiting": "w", "prefill": "f"}.get(skip, "-"), "skip"
    )


def worker_cell(row: dict[str, Any]) -> Cell:
    if row["worker_row"] is None:
        return Cell(".", "dim")
    text = amount(row["worker_num_scheduled_tokens"], row["worker_num_draft_slots"])
    if any(t < 0 for t in row["worker_draft_ids"] or ()):
        return Cell((text + "!")[:CELL], "bad")
    return Cell(text[:CELL], "ok")


def mrv2_worker_cell(row: dict[str, Any]) -> Cell:
    """MRV2's worker cell: what it ran, and where the drafts it verified came from. MRV2 books no
    placeholders: a slot it verifies holds whatever its last propose wrote there, so the mark is
    the drafts' provenance (none since it took the slot, another request's, another position's)."""
    cell = worker_cell(row)
    if row["worker_row"] is None or not row["worker_num_draft_slots"] or cell.style == "bad":
        return cell
    mark, style = draft_provenance(row)
    return Cell((cell.text + mark)[:CELL], style) if mark else cell


def draft_provenance(row: dict[str, Any]) -> tuple[str, str]:
    """('', 'ok') for drafts proposed for this request at the position it is at; else the mark."""
    if row["worker_draft_proposed_step"] is None:
        return "?", "warn"
    if row["worker_draft_proposed_for"] != row["request_id"]:
        return "x", "bad"
    if row["worker_draft_base"] != row["worker_device_computed_before"]:
        return "~", "warn"
    return "", "ok"


def slot_cell(row: dict[str, Any]) -> Cell:
    """The request's MRV2 slot where it ran (a slot taken this step shows cyan)."""
    if row["worker_slot"] is None:
        return Cell(".", "dim")
    return Cell(str(row["worker_slot"])[:CELL], "new" if row.get("worker_new_life") else "")


def drafts_from_cell(row: dict[str, Any]) -> Cell:
    """@m: the step whose propose wrote the drafts it verified; blank when it verified none."""
    if row["worker_row"] is None or not row["worker_num_draft_slots"]:
        return Cell("", "")
    if row["worker_draft_proposed_step"] is None:
        return Cell("?", "warn")
    mark, style = draft_provenance(row)
    return Cell((f"@{row['worker_draft_proposed_step']}" + mark)[:CELL], style if mark else "dim")


def short_code(code: str) -> str:
    return code.split("-", 1)[0]


def default_steps(num_steps: int, findings: list) -> tuple[int, int] | None:
    """The whole trace when short, else a window that starts a little before the first finding."""
    if num_steps <= DEFAULT_WINDOW:
        return None
    anchor = min((f.step for f in findings), default=1)
    start = max(1, anchor - 8)
    return start, min(num_steps, start + DEFAULT_WINDOW - 1)


def build_timeline(
    trace,
    findings: list,
    requests: list[str] | None = None,
    steps: tuple[int, int] | None = None,
    field_name: str | None = None,
) -> Timeline:
    """`trace`: a `TraceFile` (rows stream) or an in-memory `Trace`. Requests default to those
    with findings, else all (in order of first appearance); steps default to the whole trace."""
    import pyarrow.compute as pc

    family = runner_family_of(trace)
    fields = FIELDS_MRV2 if shows_slots(family) else FIELDS
    columns = list(_COLUMNS) + (list(MRV2_COLUMNS) if shows_slots(family) else [])
    if field_name:
        columns += [c for c in fields[field_name] if c and c not in columns]
    batches = trace.batches(columns=tuple(columns))
    if not requests:  # default: the requests with findings (a long trace has too many to show)
        requests = (
            list(dict.fromkeys(f.request_id for f in findings if f.request_id is not None))[:MAX_DEFAULT_REQUESTS]
            or None
        )
    wanted = set(requests) if requests else None
    order: dict[str, None] = {}
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    engine: dict[int, Cell] = {}
    first, last = steps if steps else (1, 1 << 62)
    for batch in batches:
        in_range = pc.and_(pc.greater_equal(batch.column("step"), first), pc.less_equal(batch.column("step"), last))
        marked = batch.filter(pc.and_(in_range, pc.not_equal(pc.cast(batch.column("step_event"), "string"), "")))
        for step, text in zip(marked.column("step").to_pylist(), marked.column("step_event").to_pylist()):
            engine.setdefault(step, engine_cell(text))
        keep = in_range
        if wanted is not None:
            keep = pc.and_(keep, pc.is_in(batch.column("request_id"), value_set=_array(sorted(wanted))))
        for row in batch.filter(keep).to_pylist():
            order.setdefault(row["request_id"], None)
            rows[(row["request_id"], row["step"])] = row
    by_place: dict[tuple[int, str], list[Any]] = {}
    for f in findings:
        if f.request_id is not None and first <= f.step <= last:
            by_place.setdefault((f.step, f.request_id), []).append(f)
    ids = [r for r in requests if r in order] if requests else list(order)[:MAX_DEFAULT_REQUESTS]
    # The drawn range: what was asked for, cut to the steps the rows have (an open `A:` is fine).
    seen_steps = [s for (_, s) in rows]
    lo = max(first, min(seen_steps)) if seen_steps else first
    hi = min(last, max(seen_steps)) if seen_steps else lo - 1
    lanes: list[Lane] = []
    events = {step: cell for step, cell in engine.items() if lo <= step <= hi}
    if events:
        lanes.append(Lane("engine", "events", events))
    for rid in ids:
        lanes += request_lanes(rid, rows, by_place, lo, hi, field_name, family)
    return Timeline(lo, hi, lanes, by_place, len(order), family)


def request_lanes(
    rid: str,
    rows: dict[tuple[str, int], dict[str, Any]],
    by_place: dict[tuple[int, str], list[Any]],
    lo: int,
    hi: int,
    field_name: str | None,
    family: str = DEFAULT_FAMILY,
) -> list[Lane]:
    """One request's lanes over steps lo..hi: scheduler, worker (on MRV2 also its slot and its
    drafts' origin), the chosen field, findings."""
    sched, worker, marks = Lane(rid, "sched"), Lane(rid, "worker"), Lane(rid, "findings")
    mrv2 = shows_slots(family)
    fields = FIELDS_MRV2 if mrv2 else FIELDS
    slots, origins = Lane(rid, "worker slot"), Lane(rid, "worker from")
    extra = (
        [
            Lane(rid, f"{side} {FIELD_LABELS[field_name]}")
            for side, col in zip(("sched", "worker"), fields.get(field_name, ()))
            if col
        ]
        if field_name
        else []
    )
    for step in range(lo, hi + 1):
        row = rows.get((rid, step))
        if row is None:
            continue
        sched.cells[step] = sched_cell(row)
        worker.cells[step] = mrv2_worker_cell(row) if mrv2 else worker_cell(row)
        if mrv2:
            slots.cells[step] = slot_cell(row)
            origins.cells[step] = drafts_from_cell(row)
        for lane, col in zip(extra, [c for c in fields.get(field_name, ()) if c]):
            value = row[col]
            lane.cells[step] = Cell("." if value is None else str(value)[:CELL], "dim" if value is None else "")
        here = by_place.get((step, rid))
        if here:
            # errors before warnings: the cell names the worst thing that happened there
            codes = [
                short_code(c)
                for c in sorted(
                    {f.code for f in here}, key=lambda c: (next(f.severity for f in here if f.code == c) != "error", c)
                )
            ]
            text = codes[0] + ("*" if len(codes) > 1 else "")
            marks.cells[step] = Cell(text[:CELL], "bad" if any(f.severity == "error" for f in here) else "warn")
    if mrv2:
        kept_slots(slots, rows, rid)
    return [sched, worker] + ([slots, origins] if mrv2 else []) + extra + ([marks] if marks.cells else [])


def kept_slots(lane: Lane, rows: dict[tuple[str, int], dict[str, Any]], rid: str) -> None:
    """Out of the batch, an MRV2 request still holds its slot (a slot is freed only when it
    finishes or is preempted): a gap between two steps it ran in the same slot, coming back as no
    new request, is drawn as that slot in brackets, the slot it kept."""
    ran = sorted(step for step, cell in lane.cells.items() if cell.text != ".")
    for before, after in zip(ran, ran[1:]):
        slot, back = rows[(rid, before)]["worker_slot"], rows[(rid, after)]
        if after - before > 1 and back["worker_slot"] == slot and not back["worker_new_life"]:
            for step in range(before + 1, after):
                if step in lane.cells:
                    lane.cells[step] = Cell(f"({slot})"[:CELL], "dim")


def _array(values: list[str]):
    import pyarrow as pa

    return pa.array(values, pa.string())
