"""The hang trigger: a flight recorder's window written out when the engine stops making progress.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli, beside the flight recorder (families/vllm/flight.py), for an attached
recording with a window (`SPECREPLAY_RECORD=DIR SPECREPLAY_WINDOW=STEPS`) and
`SPECREPLAY_HANG=SECONDS`. A deadlock raises nothing (vLLM #54269: Model Runner V2 with data
parallelism, async scheduling and a drafter stops after minutes, "no fault string of any
kind"), so the crash path never runs; this is the path that does.

Every recorded process counts the steps it begins and returns from (`PROGRESS`: the engine
core's `step()`, a worker's `execute_model`). A watchdog thread in the engine core looks every
fraction of SECONDS: when no engine step has returned for SECONDS while requests are waiting or
running (and the scheduler is not paused), it writes its window under `DIR/hang-TIME-PID/` with a
`hang` line (how long, how many requests) and a `progress` line (the last step this process
began and returned from, and how long it has been inside it), then asks the run's other
processes for theirs. A worker stuck in a collective or a kernel may never run a Python signal
handler on its main thread, so with SPECREPLAY_HANG set each process also has a watcher thread
that reads the request file `specreplay snapshot` and a dying core leave (flight.py) and dumps
from there. The engine is left as it was: nothing is interrupted, and if it goes on, it goes on.
One dump per stall: progress resets the watchdog.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specreplay.traces.errors import InputError

HANG_ENV = "SPECREPLAY_HANG"


def hang_seconds() -> float | None:
    """The stall SPECREPLAY_HANG asks for, in seconds (None: unset, no watchdog)."""
    raw = os.environ.get(HANG_ENV, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise InputError(f"{HANG_ENV}={raw!r}: expected the seconds without a finished engine step (a number > 0)")
    return seconds


@dataclass
class Progress:
    """This process's steps: begun and returned from, and when (monotonic seconds). Written by
    the engine's thread (two stores per step), read by the watchdog's."""

    role: str = "?"
    began: int = 0
    returned: int = 0
    step: int | None = None  # the core: the last engine step scheduled when its last iteration began
    began_at: float = 0.0
    returned_at: float = 0.0

    def begin(self, step: int | None = None) -> None:
        self.began += 1
        self.step = step
        self.began_at = time.monotonic()

    def end(self) -> None:
        self.returned += 1
        self.returned_at = time.monotonic()

    def line(self) -> dict[str, Any]:
        """The dump's `progress` line: where this process is."""
        now = time.monotonic()
        inside = self.began > self.returned
        return {
            "e": "progress",
            "role": self.role,
            "pid": os.getpid(),
            "began": self.began,
            "returned": self.returned,
            "step": self.step,
            "inside_s": round(now - self.began_at, 3) if inside else None,
            "since_return_s": round(now - self.returned_at, 3) if self.returned else None,
        }


PROGRESS = Progress()
_state: dict[str, Any] = {"watcher": None, "dumped": set()}
_lock = threading.Lock()


def _after_fork() -> None:  # a forked child's steps are its own, and its threads are gone
    global PROGRESS
    PROGRESS = Progress()
    _state.update(watcher=None, dumped=set())


os.register_at_fork(after_in_child=_after_fork)


def describe(progress: dict[str, Any]) -> str:
    """One process's `progress` line in words."""
    who = f"{progress.get('role')} {progress.get('pid')}"
    step = progress.get("step")
    what = f"the iteration after step {step}" if step is not None else f"its step call {progress.get('began')}"
    if progress.get("inside_s") is not None:
        return f"{who}: inside {what} for {progress['inside_s']:.1f} s (it never returned)"
    since = progress.get("since_return_s")
    idle = f", {since:.1f} s ago" if since is not None else ""
    return f"{who}: returned from {what}{idle}, began no other"


def start(role: str, seconds: float, busy: Callable[[], int] | None = None) -> None:
    """This process records with a window and SPECREPLAY_HANG: name its progress, and start its
    one watcher thread, which answers a hang dump's request even while the main thread is stuck.
    The engine core's also watches: `busy()` is the count of requests waiting or running (0 when
    none, or when the scheduler is paused)."""
    PROGRESS.role = role
    with _lock:
        if _state["watcher"] is not None:
            return
        watcher = threading.Thread(target=_watch, args=(seconds, busy), name="specreplay-hang", daemon=True)
        _state["watcher"] = watcher
    watcher.start()


def _watch(seconds: float, busy: Callable[[], int] | None) -> None:
    tick = min(1.0, max(0.05, seconds / 4))
    calm_at = time.monotonic()  # the last time the engine had nothing to do (or was paused)
    fired_for = None  # the stall a dump was written for: one dump per stall
    while True:
        time.sleep(tick)
        try:
            _answer_requests()
            if busy is None:
                continue
            now, requests = time.monotonic(), busy()
            if not requests:
                calm_at = now
                continue
            since = max(calm_at, PROGRESS.returned_at)
            if now - since >= seconds and fired_for != since:
                fired_for = since
                _dump_hang(now - since, requests, seconds)
        except Exception:  # never into the engine; a watchdog that failed once tries again
            continue


def _dump_hang(stalled_s: float, requests: int, limit_s: float) -> None:
    from specreplay.replay.families.vllm.flight import _dump_the_others, dump_all, dump_name

    hang = {"e": "hang", "seconds": round(stalled_s, 3), "requests": requests, "limit_s": limit_s}
    name = dump_name("hang")
    _remember(name)
    written = dump_all("hang", name, extra=(hang, PROGRESS.line()))
    if written:
        _dump_the_others(os.path.dirname(written[0]))


def _remember(name: str) -> bool:
    """Mark dump `name` as this process's to write; False when it was already (the SIGUSR1
    handler and the watcher both answer one request)."""
    with _lock:
        if name in _state["dumped"]:
            return False
        _state["dumped"].add(name)
        return True


def _answer_requests() -> None:
    """A hang dump another process asked for (flight.py's request file), written from this
    thread: the main thread, which runs the SIGUSR1 handler, may be the one that is stuck."""
    from specreplay.replay.families.vllm.flight import REQUEST_FILE, dump_requested, windowed_writers

    writers = windowed_writers()
    if not writers:
        return
    try:
        with open(os.path.join(writers[0].folder, REQUEST_FILE), encoding="utf-8") as fh:
            name = (fh.read().split() or [""])[0]
    except OSError:
        return
    with _lock:
        asked = name.startswith("hang-") and name not in _state["dumped"]
    if asked:
        dump_requested()  # claims it, so the SIGUSR1 path does not write it again


def claim(name: str) -> bool:
    """flight.dump_requested asks before it writes a requested dump: a hang's is written once per
    process, by whichever of its two paths comes first."""
    return not name.startswith("hang-") or _remember(name)


def extra_lines(name: str) -> tuple[dict[str, Any], ...]:
    """What a requested dump adds: a hang's says where this process is."""
    return (PROGRESS.line(),) if name.startswith("hang-") else ()
