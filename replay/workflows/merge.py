"""Merge: the part files an attached vLLM wrote (`SPECREPLAY_RECORD=DIR`) into one trace.

Where it sits: workflows, over engines (what wrote the part files: families/vllm/attached.py) ->
traces (their format and readers: traces/parts.py). What `specreplay merge DIR -o run.parquet` and
`specreplay record --attach` call.

The parts of one run are those whose first line names its run id; a folder holding two runs is
refused unless `run` picks one. The engine core's part gives the engine config (read from the
real `VllmConfig`), the scheduler rows and the recorded inputs (arrivals with prompt ids and
sampling parameters, aborts, pauses, cache resets, streaming chunks); the runners' parts give
the worker view. A process killed at any moment loses at most its last 20 ms of events and the
line it was writing (traces/parts.py): that line is dropped and counted, and trailing steps
whose scheduled rows never got their worker rows (the step the kill cut) are dropped, each named
with why, with what the cut iteration applied to the steps before it (`unapply_cut`). A line
damaged inside a part (any but its last) is no such death: the part is refused in one line
naming the file and the line, or, with `salvage`, kept up to the damage and said (`salvaged`);
a part whose header line was lost (cut, damaged, an empty file) is named (`unnamed_part`). A runner
specreplay does not observe (a fork's, a future release's: the plugin's `unknown_runner` line)
never sends worker rows: the trace keeps the scheduler view, nothing cut, and says in one line
that the worker view was not recorded, naming the class and the runners specreplay observes.
Nothing is dropped silently: the trace's outcome is `partial` when anything was, with the last
whole step.

The trace's workload is a summary of the recorded inputs in specreplay's workload format
(prompt lengths, max_tokens, arrival steps, events), so `info`, `show` and the checker read it
as any other; the exact inputs (prompt token ids, stop token ids, min_tokens, ignore_eos, each
life and chunk) are kept beside it in the trace's `inputs` metadata, from which a replay takes
its prompts, chunks and stop tokens (families/vllm/recorded_inputs.py). Its steps are the recorded
engine's (schedule() calls), and each abort lands where the rows say vLLM took it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specreplay.traces.errors import InputError
from specreplay.traces.header import UNOBSERVED_RUNNER, Inputs
from specreplay.traces.parts import finishes, whole_steps  # the cut (a live run's journal makes it too)
from specreplay.traces.schema import columns_written_by
from specreplay.traces.trace import Trace

INPUT_KINDS = ("request", "stream", "abort", "event")


@dataclass
class Merged:
    path: Path
    trace: Trace
    run: str
    parts: int
    dropped: list[str] = field(default_factory=list)  # what was dropped and why, one line each
    failures: list[str] = field(default_factory=list)  # specreplay's own failures while recording


def merge_to(folder: Path, output: Path, run: str | None = None, salvage: bool = False) -> Merged:
    """Merge the run's parts under `folder` into the trace `output` (written atomically)."""
    from specreplay.traces.io import write_trace

    merged = merge_folder(folder, run, salvage)
    write_trace(merged.trace, output)
    merged.path = Path(output)
    return merged


def merge_folder(folder: Path, run: str | None = None, salvage: bool = False) -> Merged:
    """`salvage`: a part damaged inside (traces/parts.py `Damage`) keeps what precedes the
    damage, said in `dropped`; without it such a part is refused, in one line naming it."""
    from specreplay.replay.engines.outcome import run_outcome
    from specreplay.replay.engines.registry import ATTACHED
    from specreplay.replay.engines.run import trace_header
    from specreplay.replay.families.vllm.sink import rows_to_table
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.config import BEFORE_PREFIX_CACHING, EngineConfig
    from specreplay.traces.parts import (
        collect_inputs,
        merge_rows,
        not_recorded,
        observer_failures,
        ran_classes,
        read_parts,
        unknown_runners,
    )

    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder (the SPECREPLAY_RECORD folder of a recorded run)")
    read = read_parts(str(folder))
    # Every part an attached process writes opens with its header line, which names the run; a
    # part without one is named here, whatever happened to it, never left to the run count.
    unnamed = [p for p in read if p.run is None]
    for part in unnamed:
        if part.events and part.damaged is None:
            raise InputError(
                f"{part.path}: line 1 is not a part header naming its run (found {_line_kind(part.events[0])}): "
                "not a part file an attached vLLM process wrote; move it out of the folder"
            )
    parts = [p for p in read if p.run is not None]
    if not parts:
        dumps = sorted(d.name for d in folder.iterdir() if d.is_dir() and any(d.glob("*.jsonl")))
        if dumps:  # a flight recorder's folder (families/vllm/flight.py): its dumps are the parts folders
            listing = ", ".join(str(folder / d) for d in dumps[:5]) + (" ..." if len(dumps) > 5 else "")
            raise InputError(f"{folder}: a flight recorder's folder: merge one of its {len(dumps)} dump(s): {listing}")
        if unnamed:
            raise InputError(f"{folder}: no part names its run: {unnamed[0].path}: {unnamed_part(unnamed[0])}")
        raise InputError(f"{folder}: no part files (*.jsonl); was SPECREPLAY_RECORD={folder} set for the vLLM process?")
    runs: dict[str | None, list] = defaultdict(list)
    for part in parts:
        runs[part.run].append(part)
    if run is None:
        if len(runs) > 1:
            listing = ", ".join(f"{r or '(no run id)'} ({len(ps)} parts)" for r, ps in sorted(runs.items(), key=str))
            raise InputError(f"{folder}: parts of {len(runs)} runs: {listing}; merge one with --run ID")
        run = next(iter(runs))
    elif run not in runs:
        raise InputError(f"{folder}: no parts of run {run!r}; runs here: {', '.join(sorted(map(str, runs)))}")
    parts = runs[run]
    notes = salvaged(parts + unnamed, salvage)
    notes += [f"{os.path.basename(p.path)}: {unnamed_part(p)}; not joined to the run" for p in unnamed]
    cores = [p for p in parts if p.role == "core"]
    unset = not_recorded(parts)
    recorded_cores = [p for p in cores if any(e.get("e") == "config" for e in p.events)]
    # The plugin could not set up (MRV2 on a CPU without the interpreter), or would not record
    # (a token mode it cannot honour): nothing but why.
    if unset and not recorded_cores:
        raise InputError(f"{folder}: nothing recorded: {unset[0]}")
    if not cores:
        lost = [p for p in unnamed if p.role == "core"]
        if lost:  # its header is the line that was lost: the part is the run's, by its name
            raise InputError(f"{folder}: run {run} has no engine-core part: {lost[0].path}: {unnamed_part(lost[0])}")
    if len(cores) != 1:
        raise InputError(
            f"{folder}: run {run} has {len(cores)} engine-core parts; merge needs exactly one "
            "(data-parallel engines are not supported yet)"
        )
    core = cores[0]
    window = flight_window(folder, parts, core)
    dropped = notes + [
        f"{os.path.basename(p.path)}: {p.cut_lines} line(s) cut mid-write (the process died writing them)"
        for p in parts
        if p.cut_lines
    ]
    dropped += lost_lines(parts)
    config_event = next((e for e in core.events if e.get("e") == "config"), None)
    if config_event is None:
        raise InputError(f"{folder}: run {run}'s engine-core part has no config line (cut before its first write)")
    # A part written before prefix caching was modelled ran without it (its key is absent).
    config = EngineConfig(**{**BEFORE_PREFIX_CACHING, **config_event["config"]})
    rows = merge_rows(parts)
    unknown = unknown_runners(parts)
    if unknown:  # no worker rows will ever come: the scheduler view is all there is, nothing cut
        cut_steps: list[int] = []
        dropped.append(unobserved_runner(unknown))
    else:
        # A dump comes mid-run: its last step may be one the worker had not finished, even one
        # that only announces a finish, which a whole run's end never cuts.
        whole, cut_steps = whole_steps(rows, announcements=window is not None)
        cut_note = lost_steps(rows, cut_steps, salvaged=any(p.damaged for p in parts)) if cut_steps else ""
        rows = whole
    dropped += unset
    if cut_steps:
        dropped.append(cut_note)
        unapplied = unapply_cut(rows, cut_steps[0])
        if unapplied:
            dropped.append(
                f"step(s) {', '.join(map(str, unapplied))}: output applied in the cut iteration "
                f"{cut_steps[0]}, left unapplied (the trace ends with iteration {cut_steps[0] - 1})"
            )
    tokens = token_mode_of(folder, parts)
    inputs = collect_inputs(parts)
    last_step = rows[-1]["step"] if rows else 0
    crash = crash_line(parts, window)
    # A run that died at step s is replayed up to s, where a replay of the same code dies too.
    workload = workload_of(inputs, config, run, max(last_step, crash["at"] if crash else 0), rows)
    ran = ran_classes(parts)
    # vLLM as it is (no variant: upstream), the classes its processes reported running.
    impl_doc = ATTACHED.describe(
        resolve("upstream", allow_import=False),
        ran.get("scheduler", config_event.get("scheduler_cls", "?")),
        ran.get("runner") or (unknown[0]["runner"] if unknown else "GPUModelRunner (attached)"),
        config,
        models=f"vllm {core.header.get('vllm', '?')}",
        executor="multiproc" if len({p.header.get("pid") for p in parts}) > 1 else "inproc",
        model=config_event.get("model", "?"),
        drafter=config_event.get("drafter", "none"),
        run=run,
        patches=sorted({patch for p in parts for patch in p.header.get("patches", [])}),
        runner_family=ran.get("runner_family") or (UNOBSERVED_RUNNER if unknown else None),
        tokens=tokens,
    )
    if window is not None:
        impl_doc = replace(impl_doc, window=window.note)
    failures = observer_failures(parts)
    dropped += [f"recording stopped: {failure}" for failure in failures]
    if crash is not None:  # the engine died (families/vllm/flight.py): how a replay that dies the same way ends
        named = {"request": crash["request"]} if crash.get("request") else {}
        outcome = run_outcome(crash["at"], crash={"kind": crash["kind"], "message": crash["message"], **named})
    else:
        outcome = run_outcome(last_step, partial="; ".join(dropped) if dropped else None)
    header = trace_header(workload, impl_doc, "cpu", outcome, config)
    trace = replace(
        header,
        table=rows_to_table(rows),
        inputs=Inputs.from_dict(inputs) if inputs else None,
        schema_version=parts_schema(parts),
    )
    return Merged(Path(), trace, str(run), len(parts), dropped, failures)


def salvaged(parts: list[Any], salvage: bool) -> list[str]:
    """Parts damaged inside (traces/parts.py `Damage`): refused, in one line naming the file and
    the line; with `salvage`, each keeps what precedes its damage, and a note says so."""
    notes = []
    for part in parts:
        damage = part.damaged
        if damage is None:
            continue
        if not salvage:
            keeps = (
                f"merge --salvage keeps the {damage.line - 1} line(s) before it"
                if damage.line > 1
                else "it is the header that names the run: merge --salvage keeps nothing of this file"
            )
            raise InputError(
                f"{part.path}: {damage}, and {damage.lines - damage.line} line(s) follow it: a process that dies "
                "writing leaves only its last line cut, so the file was damaged after it was written; "
                f"nothing merged ({keeps})"
            )
        part.salvage()
        notes.append(
            f"{os.path.basename(part.path)}: {damage}: --salvage kept the {damage.line - 1} line(s) before it "
            f"and dropped the {damage.lines - damage.line + 1} from it on"
        )
    return notes


def unnamed_part(part: Any) -> str:
    """What a part with no header line naming its run holds: its header cut or damaged, or nothing."""
    damage = part.damaged
    if damage is not None and damage.line == 1:
        return f"its header line, which names the run, is damaged ({damage.why}; line 1 of {damage.lines})"
    if part.size == 0:
        return "empty (0 bytes): its process died before it wrote its header line, which names the run"
    if part.cut_lines:
        return f"its only line, the header that names the run, is cut ({part.size} bytes): its process died writing it"
    return "no header line naming the run"


def _line_kind(event: dict[str, Any]) -> str:
    if event.get("e") == "part":
        return "a part header with no run id"
    return f"a {event.get('e')!r} line" if "e" in event else "a JSON object with no 'e' key"


def lost_lines(parts: list[Any]) -> list[str]:
    """What each part's writer said it could not write (its `lost` lines: a full disk)."""
    notes = []
    for part in parts:
        lost = [e for e in part.events if e.get("e") == "lost"]
        if lost:
            why = sorted({str(e.get("why") or "?") for e in lost})
            count = sum(int(e.get("lines") or 0) for e in lost)
            notes.append(
                f"{os.path.basename(part.path)}: {count} line(s) lost, never written ({'; '.join(why)}): "
                "the steps they held are cut or their columns unset"
            )
    return notes


@dataclass
class FlightWindow:
    """A flight recorder's dump (traces/window.py): the recorded steps it replays from on."""

    start: int  # the recorded engine's step that is step 1 of the trace
    last: int
    reason: str
    dropped_steps: int | None = None  # what the ring overwrote before it (None: a dump older than the count)
    dropped_rows: int | None = None

    @property
    def shift(self) -> int:
        return self.start - 1

    @property
    def note(self) -> str:
        overwrote = ""
        if self.dropped_steps is not None:
            overwrote = (
                f"; the ring overwrote {self.dropped_steps} earlier step(s), {self.dropped_rows} scheduler row(s)"
                if self.dropped_steps
                else "; the ring overwrote nothing"
            )
        return (
            f"steps {self.start}..{self.last} of the recorded engine (dumped on {self.reason}); "
            f"step 1 here is step {self.start}{overwrote}"
        )


def flight_window(folder: Path, parts: list[Any], core: Any) -> FlightWindow | None:
    """For a dump: cut every part at the window's first replayable step and number its steps from
    1 (traces/window.py); None for an ordinary parts folder. A window with no step at which the
    engine held nothing older does not replay: refused, in one line, with what to do."""
    from specreplay.traces.window import rebase, replayable_start, window_line

    line = window_line(core.events)
    if line is None:
        return None
    found = replayable_start(core.events, bool(line.get("dropped")))
    if found is None:
        raise InputError(
            f"{folder}: this window (steps {line.get('first_step')}..{line.get('last_step')}, "
            f"SPECREPLAY_WINDOW={line.get('steps')}) holds no step at which the engine held no request "
            "from before it, so no replay can start inside it; record with a larger SPECREPLAY_WINDOW"
        )
    start, leftovers = found
    for part in parts:
        part.events = rebase(part.events, start, leftovers)
    reason = str(line.get("reason") or "?")
    check = next((e for p in parts for e in p.events if e.get("e") == "check"), None)
    if check is not None:  # an online check wrote it (traces/online_checks.py): which, and what it saw
        reason = f"check {check.get('name')}: {check.get('message')}"
    hang = next((e for p in parts for e in p.events if e.get("e") == "hang"), None)
    if hang is not None:  # the hang watchdog wrote it (families/vllm/hang.py): how long, and where each process is
        from specreplay.replay.families.vllm.hang import describe

        where = "; ".join(describe(e) for p in parts for e in p.events if e.get("e") == "progress")
        reason = (
            f"hang: no engine step returned for {float(hang.get('seconds') or 0):.1f} s with "
            f"{hang.get('requests')} request(s) waiting or running" + (f" ({where})" if where else "")
        )
    counted = line.get("dropped_steps")
    return FlightWindow(
        start,
        int(line.get("last_step") or start),
        reason,
        None if counted is None else int(counted),
        None if counted is None else int(line.get("dropped_rows") or 0),
    )


def crash_line(parts: list[Any], window: FlightWindow | None) -> dict[str, Any] | None:
    """The engine core's `crashed` line (families/vllm/flight.py), its step in the trace's numbering."""
    found = next((e for p in parts for e in p.events if e.get("e") == "crashed"), None)
    if found is None:
        return None
    at = int(found.get("at") or 0) - (window.shift if window is not None else 0)
    return {
        "at": max(1, at),
        "kind": str(found.get("kind") or "engine-crash"),
        "message": str(found.get("message")),
        "request": found.get("request"),
    }


def parts_schema(parts: list[Any]) -> int:
    """The trace schema a run's rows follow: its parts' oldest (a part header without one was
    written before schema v8 added it, by a specreplay whose rows were v7's). A diff of the merged
    trace leaves out the columns its parts did not record."""
    from specreplay.traces import schema

    versions = [int(p.header.get("schema", 7)) for p in parts if p.header]
    return min(versions, default=schema.SCHEMA_VERSION)


def token_mode_of(folder: Path, parts: list[Any]) -> str:
    """How the run's parts wrote token ids (traces/pseudonym.py): one mode for all, or the ids of
    one part would not be the ids of another. Parts from before the mode was recorded: plain."""
    written = [p.header.get("tokens", "plain") for p in parts if p.header]  # None: a part that holds no ids
    modes = {mode for mode in written if mode is not None}
    if len(modes) > 1:
        raise InputError(
            f"{folder}: the run's parts wrote token ids in different modes ({', '.join(sorted(modes))}): "
            "their ids cannot be joined; was SPECREPLAY_TOKENS set for some of its processes only?"
        )
    return modes.pop() if modes else "plain"


def unobserved_runner(unknown: list[dict[str, str]]) -> str:
    """The one line for runners specreplay does not observe (plugin's `unknown_runner` lines): the
    trace keeps the scheduler view, and says its worker view was not recorded and why."""
    from specreplay.replay.engines.registry import known_runners

    classes = ", ".join(dict.fromkeys(u.get("runner", "?") for u in unknown))
    return (
        f"the worker view (not recorded): the worker ran {classes}, a runner specreplay does not observe "
        f"(it observes {known_runners()}); the trace holds the scheduler view only"
    )


def lost_steps(rows: list[dict[str, Any]], cut: list[int], salvaged: bool = False) -> str:
    """The dropped-line for the steps `whole_steps` cut: what the first of them did and what of it
    never arrived. `salvaged`: a part lost its tail to `merge --salvage`, which may be why."""
    first = [r for r in rows if r["step"] == cut[0]]
    steps = ", ".join(map(str, cut))
    if any(r.get("sched_num_scheduled_tokens") for r in first):
        why = "the run stopped inside it" + (", or --salvage dropped them" if salvaged else "")
        return f"step(s) {steps}: step {cut[0]} was scheduled, but its worker rows never arrived ({why})"
    ids = ", ".join(repr(r["request_id"]) for r in finishes(first))
    why = "the dump came before the worker ran the step" + (", or --salvage dropped it" if salvaged else "")
    return (
        f"step(s) {steps}: step {cut[0]} scheduled nothing and announced the finish of {ids}, but the worker's "
        f"row of that never arrived ({why})"
    )


def unapply_cut(rows: list[dict[str, Any]], first_cut: int) -> list[int]:
    """An iteration is a schedule() and the update_from_output() of an earlier step (async: the
    step before). When iteration `first_cut` is cut, its schedule's rows go (whole_steps), and so
    must what its update wrote on the kept rows: the trace ends with a whole iteration, which is
    what a replay of its `first_cut - 1` steps runs (else it would differ on the last output,
    applied in an iteration it never reaches). Returns the steps whose apply was taken back."""
    apply_columns = columns_written_by("apply")
    unapplied = set()
    for row in rows:
        applied_at = row.get("apply_step")
        if applied_at is not None and applied_at >= first_cut:
            unapplied.add(row["step"])
            row.update(dict.fromkeys(apply_columns))
    return sorted(unapplied)


def workload_of(
    inputs: dict[str, Any], config: Any, run: str, last_step: int, rows: list[dict[str, Any]] | None = None
) -> Any:
    """The recorded inputs as a workload (a summary: lengths and steps, not token ids; a life's
    own max_tokens on its resubmit event). `rows`: the scheduler's, which say where each abort
    landed (see `abort_event`)."""
    from specreplay.replay.workloads.workload import Workload

    requests, events = [], []
    first = {}
    marked = {(r["step"], r["request_id"]) for r in rows or () if r.get("sched_event") == "abort"}
    for r in inputs["requests"]:
        if r["id"] not in first:
            first[r["id"]] = r
            requests.append(
                {
                    "id": r["id"],
                    "arrival_step": max(1, r["step"]),
                    "prompt_len": max(1, len(r["prompt"])),
                    "max_tokens": max(1, r["max_tokens"]),
                    "streaming": bool(r["streaming"]),
                }
            )
        else:
            item = {"step": r["step"], "kind": "resubmit", "request": r["id"]}
            if r["max_tokens"] != first[r["id"]]["max_tokens"]:
                item["max_tokens"] = max(1, r["max_tokens"])
            events.append(item)
    for a in inputs["aborts"]:
        if a["id"] in first:
            events.append(abort_event(a, first[a["id"]]["step"], marked))
    for c in inputs["chunks"]:
        # The end of a stream (AsyncLLM's final non-resumable request) is no chunk: the replay
        # ends a session's stream after its last one.
        if c["prompt"] and not c.get("end") and c["id"] in first:
            events.append(
                {
                    "step": c["step"],
                    "kind": "stream_append",
                    "request": c["id"],
                    "tokens": len(c["prompt"]),
                    "max_tokens": max(1, c["max_tokens"]),
                }
            )
    for e in inputs["events"]:
        if e["kind"] == "pause":
            mode = "keep" if e.get("state") == "paused_all" else "wait"
            events.append({"step": e["step"], "kind": "pause", "mode": mode, "clear_cache": False})
        elif e["kind"] in ("resume", "reset_prefix_cache"):
            item = {"step": e["step"], "kind": e["kind"]}
            if e["kind"] == "reset_prefix_cache":
                item["reset_running"] = bool(e.get("reset_running"))
            events.append(item)
    doc = {
        "name": f"attached-{run}",
        "seed": 0,
        "acceptance": "all",
        "max_steps": max(1, last_step),
        "config": config.to_dict(),
        "requests": requests,
        "events": sorted(events, key=lambda e: e["step"]),
    }
    try:
        return Workload.from_dict(doc)
    except InputError:
        # Some real traffic has no exact form in the workload format (a resubmission with another
        # prompt, a pause left unresumed): keep the requests, the events stay in `inputs`.
        return Workload.from_dict({**doc, "events": []})


def abort_event(abort: dict[str, Any], arrival: int, marked: set[tuple[int, str]]) -> dict[str, Any]:
    """Where an abort recorded at step s (schedule() calls before it) lands, as a workload event.
    vLLM takes it from one of two queues (observers/input_observer.py): the input queue, before step
    s + 1's schedule(), whose row then carries the `abort` event; or the early-aborts queue,
    after step s's schedule() and before the oldest batch is applied (`when = "after"`). Aborted
    before its first schedule(), a request is aborted at its arrival step."""
    rid, step = abort["id"], abort["step"]
    if step < arrival or (step + 1, rid) in marked:
        return {"step": max(step + 1, arrival), "kind": "abort", "request": rid}
    return {"step": max(1, step), "kind": "abort", "request": rid, "when": "after"}


__all__ = [
    "Merged",
    "abort_event",
    "merge_folder",
    "merge_to",
    "lost_steps",
    "unapply_cut",
    "unobserved_runner",
    "whole_steps",
    "workload_of",
]
