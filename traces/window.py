"""The flight recorder's window: a part's last steps held in memory, written out when asked.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli, beside the part files (traces/parts.py), with no knowledge of vLLM.
With `SPECREPLAY_WINDOW=STEPS` beside `SPECREPLAY_RECORD=DIR`, a part writer keeps its encoded
lines here instead of writing them: the lines of the last STEPS engine steps, plus the lines no
step owns (the part's header, the engine config, what ran, specreplay's own errors). A dump
(families/vllm/flight.py: the engine died, SIGUSR1, `specreplay snapshot`) writes them as an ordinary
part under `DIR/<dump>/`, its second line a `window` line saying which steps it holds.

What a window replays. A replay starts from an empty engine (traces/parts.py's inputs, the
recorded outcomes), so it reproduces a window only from a step at which the recorded engine held
no request from before that step: `replayable_start` finds the earliest such step in the window
(the first step of a busy period, or step 1 when the window never dropped a step), and
`rebase` cuts the window there and numbers its steps from 1, so `merge` turns a dump into an
ordinary trace. A window that holds no such step (the engine never went idle in its last STEPS
steps) does not replay, and merge says so rather than write a trace whose first steps would be
findings of a history the window does not have.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Collection, Iterable
from typing import Any

from specreplay.traces.errors import InputError

WINDOW_ENV = "SPECREPLAY_WINDOW"
#: The columns whose values are engine steps: renumbered with the rows, null before the window.
STEP_COLUMNS = ("step", "apply_step", "worker_draft_proposed_step", "worker_slot_last_write_step")
#: The columns a window's replay cannot reproduce, as docs/recording.md lists them ("What a
#: window replays"): on Model Runner V2, which slot each request takes. MRV2's slot allocator
#: hands out the slots in the order the requests before the window left its free list in, which
#: no window holds, and a replay starts from a fresh one. The trace diff reports these columns
#: of a window's trace apart, as not reproduced, never as a difference (check/tracediff.py).
NOT_REPRODUCED_BY_A_WINDOW = ("worker_slot", "worker_slot_prev_owner", "worker_slot_last_write_step")
#: Recorded inputs carry the number of schedule() calls before them (traces/parts.py).
INPUT_KINDS = ("request", "stream", "abort", "event")


def window_steps() -> int | None:
    """The window SPECREPLAY_WINDOW asks for, in engine steps (None: unset, record everything)."""
    raw = os.environ.get(WINDOW_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise InputError(f"{WINDOW_ENV}={raw!r}: expected a number of engine steps (an integer >= 1)")
    return int(raw)


def step_of(event: dict[str, Any]) -> int | None:
    """The engine step a part line belongs to; None for the lines no step owns (kept always)."""
    kind = event.get("e")
    if kind == "rows":
        rows = event.get("rows") or ()
        return int(rows[0][0]) if rows else None
    if kind == "patch":
        rows = event.get("rows") or ()
        return max(int(r[0]) for r in rows) if rows else None
    if kind in ("cols", "step") or kind in INPUT_KINDS:
        return int(event["step"])
    return None


class Window:
    """One part's encoded lines of its last `steps` steps, in the order written. A line of an
    older step that arrives late (an output applied a step later) stays until the lines before
    it go: the window may hold a step or two more than asked, never fewer."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.pinned: list[bytes] = []  # lines no step owns
        self.lines: deque[tuple[int, int, bytes]] = deque()  # (step, scheduler rows, line)
        self.bytes = 0  # what `lines` holds
        self.last_step = 0
        # What left the window (a ring that overwrites says how much: NCCL's Inspector ring kept
        # half of what its users thought it had, silently): steps, their lines, their rows.
        self.dropped_steps = 0
        self.dropped_lines = 0
        self.dropped_rows = 0
        self._last_dropped_step = 0
        self.fired_at: dict[str, int] = {}  # online check -> the last step it wrote the window at

    def may_fire(self, check: str) -> bool:
        """An online check writes the window once, then again only once the window has moved on
        past what it wrote (a request that keeps failing it is not a dump per step)."""
        last = self.fired_at.get(check)
        if last is not None and self.last_step - last < self.steps:
            return False
        self.fired_at[check] = self.last_step
        return True

    def add(self, event: dict[str, Any], line: bytes) -> None:
        step = step_of(event)
        if step is None:
            self.pinned.append(line)
            return
        rows = len(event.get("rows") or ()) if event.get("e") == "rows" else 0
        self.lines.append((step, rows, line))
        self.bytes += len(line)
        if step > self.last_step:
            self.last_step = step
            oldest = step - self.steps
            lines = self.lines
            while lines and lines[0][0] <= oldest:
                gone, rows, line = lines.popleft()
                self.bytes -= len(line)
                self.dropped_lines += 1
                self.dropped_rows += rows
                if gone > self._last_dropped_step:  # a late line of a step already gone counts once
                    self.dropped_steps += 1
                    self._last_dropped_step = gone

    @property
    def dropped(self) -> bool:
        """A step left the window: it no longer starts at the recording's first."""
        return self.dropped_lines > 0

    @property
    def first_step(self) -> int | None:
        return min((s for s, _, _ in self.lines), default=None)

    def held_bytes(self) -> int:
        return self.bytes + sum(map(len, self.pinned))

    def header(self, reason: str) -> dict[str, Any]:
        """The dump's `window` line."""
        return {
            "e": "window",
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "dropped": self.dropped,
            "dropped_steps": self.dropped_steps,
            "dropped_rows": self.dropped_rows,
            "dropped_lines": self.dropped_lines,
            "reason": reason,
        }

    def contents(self) -> list[bytes]:
        """The lines a dump writes after its header line and its `window` line."""
        return [*self.pinned[1:], *(line for _, _, line in self.lines)]


# ---------------------------------------------------------------------- reading a dump back
def window_line(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    return next((e for e in events if e.get("e") == "window"), None)


def replayable_start(events: list[dict[str, Any]], dropped: bool) -> tuple[int, set[str]] | None:
    """The earliest step of the window from which an empty engine replays it, and the requests
    from before it whose rows there only announce that they finished (vLLM announces a finish
    in the next schedule(), which may come with the next arrivals: an empty engine has nothing
    to announce, so `rebase` drops those rows). At that step, and every later one, every other
    request arrived in the window at or after the step before, and none had a row at the step
    before (the engine held nothing older). Step 1 when nothing was dropped. None: no such step."""
    rows_at: dict[int, set[str]] = {}
    live_at: dict[int, set[str]] = {}  # rows that are not a finish's announcement
    arrived: dict[str, int] = {}
    for event in events:
        kind = event.get("e")
        if kind == "rows":
            names = event["names"]
            at, status = names.index("request_id"), names.index("sched_status")
            for row in event["rows"]:
                step, rid = int(row[0]), str(row[at])
                rows_at.setdefault(step, set()).add(rid)
                if row[status] != "finished":
                    live_at.setdefault(step, set()).add(rid)
        elif kind == "request":
            arrived.setdefault(str(event["id"]), int(event["step"]))
    if not rows_at:
        return None
    steps = sorted(rows_at)
    if not dropped:
        return steps[0], set()
    later: set[str] = set()  # requests with a row at this step or after
    later_live: set[str] = set()  # ... with a row that is not an announcement
    found = None
    for i in range(len(steps) - 1, 0, -1):
        step, before = steps[i], steps[i - 1]
        later |= rows_at[step]
        later_live |= live_at.get(step, set())
        if before != step - 1:  # the step before is not in the window: its rows cannot say who was there
            continue
        older = rows_at[before] & later
        announcing = older - later_live  # only announce their finish from here on
        if older - announcing:
            continue
        if all(arrived.get(r, -1) >= step - 1 for r in later - announcing):
            found = (step, announcing)
    return found


def rebase(events: list[dict[str, Any]], start: int, leftovers: Collection[str] = ()) -> list[dict[str, Any]]:
    """The window's events from step `start` on, its steps numbered from 1 (an input recorded
    before step `start`'s schedule() at 0); a step value that points before the window, null;
    the rows of `leftovers` (requests from before it: replayable_start) dropped."""
    shift = start - 1

    def moved(value: Any) -> Any:
        if value is None:
            return None
        return int(value) - shift if int(value) >= start else None

    out = []
    for event in events:
        step = step_of(event)
        kind = event.get("e")
        if step is None:
            out.append(event)
            continue
        if kind in INPUT_KINDS:
            if step >= shift:
                out.append({**event, "step": step - shift})
            continue
        if kind == "rows":
            names = event["names"]
            at = [i for i, n in enumerate(names) if n in STEP_COLUMNS]
            rid = names.index("request_id")
            rows = [list(r) for r in event["rows"] if int(r[0]) >= start and r[rid] not in leftovers]
            for row in rows:
                for i in at:
                    row[i] = moved(row[i])
            if rows:
                out.append({**event, "rows": rows})
        elif kind == "patch":
            rows = [
                [int(s) - shift, rid, {k: moved(v) if k in STEP_COLUMNS else v for k, v in values.items()}]
                for s, rid, values in event["rows"]
                if int(s) >= start
            ]
            if rows:
                out.append({**event, "rows": rows})
        elif kind == "cols":
            if step >= start:
                cols = {k: [moved(v) for v in vs] if k in STEP_COLUMNS else vs for k, vs in event["cols"].items()}
                out.append({**event, "step": step - shift, "cols": cols})
        elif step >= start:  # a `step` line
            out.append({**event, "step": step - shift})
    return out


__all__ = [
    "NOT_REPRODUCED_BY_A_WINDOW",
    "STEP_COLUMNS",
    "WINDOW_ENV",
    "Window",
    "rebase",
    "replayable_start",
    "step_of",
    "window_line",
    "window_steps",
]
