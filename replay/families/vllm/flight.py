"""The flight recorder inside a recorded vLLM: when a process writes its window out, and where.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli, for an attached recording (`SPECREPLAY_RECORD=DIR`) with a window
(`SPECREPLAY_WINDOW=STEPS`: traces/window.py). Each process then keeps its parts' last steps in
memory and writes them, as ordinary parts, under `DIR/<dump>/` (which `specreplay merge` reads
like any parts folder) when:

- the engine dies: an exception out of the engine core's step (vLLM's scheduler, its executor,
  a runner in the same process or a worker's failure, which vLLM's executor raises there). The
  steps in flight finish first (their worker rows belong to the run a replay reproduces); the
  dump is written on the dying thread; the run's other processes (the worker of vLLM's
  multiprocess executor, which its CPU engine uses) are asked through SIGUSR1 to write theirs
  into the same folder, and waited for up to OTHERS_TIMEOUT_S; then the same exception goes on
  to vLLM's own crash path (its log line, its `EngineDeadError` to the front end): the dump
  never hides or replaces it. The core's part gets a `crashed` line (step, kind, message) from
  which merge says how the run ended, as a replay that dies the same way says it;
- an online check fails (`SPECREPLAY_DUMP_ON`, traces/online_checks.py: off by default), on the
  part writer's thread: `DIR/check-NAME-TIME-PID/`, with a `check` line naming it and what it saw;
- it is asked: SIGUSR1 (`specreplay snapshot DIR` sends it to every live recorder of DIR). The
  handler only starts a thread that dumps; the engine goes on serving;
- the engine stops making progress (`SPECREPLAY_HANG=SECONDS`, families/vllm/hang.py): no step
  returned for SECONDS while requests wait or run: `DIR/hang-TIME-PID/`, each process's with the
  last step it began and returned from.

What it leaves in DIR besides the dumps is removed once it is stale (`sweep`): a recorder's
`window-PID.live` marker at its clean exit, and by whoever next looks (a recorder starting, a
snapshot, the front end exiting after the processes it stopped) when the process was killed; the
request file a snapshot or a dying core wrote, once its dumps are written.

A recording without a window writes its parts as it goes (traces/parts.py), and an engine that
dies leaves its `crashed` line there too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

#: A live flight recorder's marker in DIR (its pid in the name), for `specreplay snapshot`.
LIVE_SUFFIX = ".live"
#: Where `specreplay snapshot` leaves the name of the dump it asks for (read by the handler).
REQUEST_FILE = "snapshot.request"

_state: dict[str, Any] = {"marker": None, "handler": False}
# A forked child records into parts of its own: its own marker (the SIGUSR1 handler it inherits).
os.register_at_fork(after_in_child=lambda: _state.update(marker=None))


def windowed_writers() -> list[Any]:
    from specreplay.traces.parts import _FLUSHER

    return [w for w in list(_FLUSHER.writers) if w.window is not None]


def flight_recorder_started(folder: str) -> None:
    """A part of this process keeps a window: leave the marker `snapshot` finds, catch SIGUSR1."""
    with contextlib.suppress(OSError):
        sweep(folder)  # what recorders killed outright before this one left here
    if not _state["handler"]:
        _state["handler"] = _catch_sigusr1()
    # The marker only where SIGUSR1 is caught: for any other process it would be a kill signal.
    if _state["marker"] is None and _state["handler"]:
        from specreplay.replay.families.vllm.attached import run_id

        marker = os.path.join(folder, f"window-{os.getpid()}{LIVE_SUFFIX}")
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:  # the run it records: a crash asks that run's processes only
            fh.write(run_id())
        _state["marker"] = marker
        import atexit

        atexit.register(_remove_marker)
        with contextlib.suppress(Exception):
            import multiprocessing.util

            multiprocessing.util.Finalize(None, _remove_marker, exitpriority=99)


def _remove_marker() -> None:
    """At a clean exit: this process's marker, and what recorders that are gone left (sweep)."""
    marker = _state["marker"]
    if marker is not None:
        with contextlib.suppress(OSError):
            os.unlink(marker)
        _sweep_quietly(os.path.dirname(marker))
        _state["marker"] = None


def sweep(folder: str) -> None:
    """Remove what flight recorders that are gone left in `folder`: the marker of each process
    no longer running (one killed outright, as vLLM's shutdown may kill its engine core and
    workers, never removes its own), and the snapshot request once no recorder runs. A stale
    marker is not only clutter: its pid may be an unrelated process's by now, which `specreplay
    snapshot` would send SIGUSR1, whose default action ends a process."""
    running = 0
    for entry in os.listdir(folder):
        pid = _marker_pid(entry)
        if pid is None:
            continue
        if _alive(pid):
            running += 1
        else:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, entry))
    if not running:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, REQUEST_FILE))


def sweep_at_exit(folder: str) -> None:
    """Sweep `folder` when this process exits cleanly: a front end (`vllm serve`'s API server,
    `LLM`) outlives the engine core and workers it stops, whatever way they went."""
    import atexit

    atexit.register(_sweep_quietly, folder)


def _sweep_quietly(folder: str) -> None:
    with contextlib.suppress(OSError):
        sweep(folder)


def _marker_pid(entry: str) -> int | None:
    """The pid a marker's name gives (`window-PID.live`); None for any other entry."""
    if not (entry.startswith("window-") and entry.endswith(LIVE_SUFFIX)):
        return None
    pid = entry[len("window-") : -len(LIVE_SUFFIX)]
    return int(pid) if pid.isdigit() else None


def _catch_sigusr1() -> bool:
    """SIGUSR1 dumps the window, after any handler the process had for it (only the main thread
    may set one: a process whose recorder starts elsewhere is dumped by its crash path only)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        before = signal.getsignal(signal.SIGUSR1)

        def on_sigusr1(signum: int, frame: Any) -> None:
            # No lock may be taken here (the interrupted thread may hold it): a thread dumps.
            threading.Thread(target=dump_requested, name="specreplay-snapshot", daemon=True).start()
            if callable(before):
                before(signum, frame)

        signal.signal(signal.SIGUSR1, on_sigusr1)
        return True
    except (ValueError, OSError):
        return False


def dump_requested() -> None:
    """The dump `specreplay snapshot` (or the run's dying engine core) asked for, under the name
    it left in DIR. A dying core also names the last step it scheduled: a worker still running
    that step (a Model Runner V2 step takes seconds on a CPU) finishes it before it dumps, so the
    dump has that step's worker rows, as a replay that dies at the next step has them."""
    writers = windowed_writers()
    if not writers:
        return
    from specreplay.replay.families.vllm import hang

    name, step = _requested(writers[0].folder)
    name = name or dump_name("snapshot")
    if not hang.claim(name):
        return
    if step is not None:
        deadline = time.monotonic() + OTHERS_TIMEOUT_S / 2
        while time.monotonic() < deadline:
            for writer in writers:
                writer.flush()
            if all(w.window.last_step >= step for w in writers if w.name.startswith("runner-")):
                break
            time.sleep(0.02)
    # A crash or a hang of the run's engine core asks under its own name.
    dump_all(name.split("-", 1)[0], name, extra=hang.extra_lines(name))


def _requested(folder: str) -> tuple[str | None, int | None]:
    """The dump's name the request file gives, and the step to wait for (a crash's), if any."""
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(folder, REQUEST_FILE), encoding="utf-8") as fh:
            lines = fh.read().split()
        name = lines[0] if lines else ""
        if name and os.sep not in name and not name.startswith("."):
            return name, (int(lines[1]) if len(lines) > 1 else None)
    return None, None


def dump_name(reason: str) -> str:
    return f"{reason}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"


def dump_all(reason: str, name: str | None = None, extra: tuple[dict[str, Any], ...] = ()) -> list[str]:
    """Every window of this process written under DIR/<name>/; one line on stderr saying where.
    Never raises: a dump that fails (a full disk) says so and the engine's own fate goes on."""
    name = name or dump_name(reason)
    written = []
    for writer in windowed_writers():
        try:
            path = writer.dump(os.path.join(writer.folder, name), reason, list(extra))
        except Exception as exc:  # the engine's crash path must go on whatever this does
            print(f"specreplay: flight recorder: could not write its window: {exc}", file=sys.stderr)
            continue
        if path is not None:
            written.append(path)
    if written:
        steps = [w.window for w in windowed_writers()]
        first = min((s.first_step for s in steps if s.first_step is not None), default=0)
        last = max((s.last_step for s in steps), default=0)
        overwrote = max((s.dropped_steps for s in steps), default=0)
        folder = os.path.dirname(written[0])
        print(
            f"specreplay: flight recorder ({reason}): steps {first}..{last} written to {folder} "
            f"(the ring overwrote {overwrote} earlier step(s)); "
            f"merge it: specreplay merge {folder} -o window.parquet",
            file=sys.stderr,
        )
    return written


def on_engine_death(exc: BaseException, core: Any, clock: dict[str, Any]) -> None:
    """The engine core `core` is dying of `exc` (a worker's failure reaches it too, through
    vLLM's executor): the steps it still has in flight on the workers finish (so their worker
    rows are in the parts: a replay runs them too), its `crashed` line goes in the core's part
    (`clock`: its step count), then the window dump and the dumps of the run's other processes.
    The caller re-raises `exc` unchanged."""
    if getattr(exc, "_specreplay_dumped", False) or not isinstance(exc, Exception):
        return  # KeyboardInterrupt, SystemExit: a shutdown, not a death
    with contextlib.suppress(Exception):
        exc._specreplay_dumped = True  # type: ignore[attr-defined]
    _let_in_flight_steps_finish(core)
    scheduler = getattr(core, "scheduler", None)
    step = clock["step"] + (1 if clock.get("in_schedule") else 0)
    crashed = {"e": "crashed", "at": step, "kind": crash_kind(exc, scheduler), "message": crash_text(exc)}
    request = crash_request(exc, scheduler)
    if request is not None:
        crashed["request"] = request
    for writer in _core_writers():
        if writer.window is None:  # a whole-run recording: the line goes out with its parts
            writer.write(crashed, now=True)
    with contextlib.suppress(Exception):
        written = dump_all("crash", extra=(crashed,))
        if written:
            _dump_the_others(os.path.dirname(written[0]), last_step=clock["step"])


def _let_in_flight_steps_finish(core: Any) -> None:
    """Wait (at most OTHERS_TIMEOUT_S in all) for the steps in vLLM's batch queue: a worker still
    running one (async scheduling keeps one in flight; a Model Runner V2 step takes seconds on a
    CPU) would otherwise be dumped without its rows of it. Their outputs are never applied: the
    engine is dying, as a replay that dies at the same step has them."""
    deadline = time.monotonic() + OTHERS_TIMEOUT_S
    for entry in list(getattr(core, "batch_queue", None) or ()):
        future = entry[0] if isinstance(entry, tuple) else entry
        with contextlib.suppress(Exception):
            future.result(timeout=max(0.0, deadline - time.monotonic()))


def check_failed(name: str, message: str) -> None:
    """An online check failed on a line this process recorded (traces/online_checks.py): the
    window goes out under `DIR/check-NAME-TIME-PID/`, the run's other processes' with it, and
    the engine goes on. Never raises (it runs on the part writer's thread)."""
    with contextlib.suppress(Exception):
        reason = f"check-{name}"
        written = dump_all(reason, dump_name(reason), extra=({"e": "check", "name": name, "message": message},))
        if written:
            _dump_the_others(os.path.dirname(written[0]))


#: How long a dying engine core waits for its steps in flight, then for the run's other
#: processes (its workers) to write their windows into its crash dump, before vLLM's crash path
#: goes on (and shuts them down).
OTHERS_TIMEOUT_S = 10.0


def _dump_the_others(dump: str, last_step: int | None = None) -> None:
    """The run's other flight recorders (a worker process: vLLM's multiprocess executor, which
    its CPU and tensor-parallel engines use) write their windows into the same dump, through
    the SIGUSR1 path `specreplay snapshot` takes; the engine core waits for them a little."""
    from specreplay.replay.families.vllm.attached import run_id

    folder, name = os.path.split(dump)
    others = [pid for pid in live_recorders(folder, run_id()) if pid != os.getpid()]
    if others:
        try:
            wait_for_windows(dump, ask_for_windows(folder, name, others, last_step), OTHERS_TIMEOUT_S)
        finally:
            withdraw_request(folder, name)


def ask_for_windows(folder: str, name: str, pids: list[int], last_step: int | None = None) -> list[int]:
    """Ask the flight recorders `pids` of `folder` to write their windows into `folder/name`
    (the request file their SIGUSR1 handler reads: the name, and a dying core's last step);
    the pids still there to ask."""
    request = os.path.join(folder, REQUEST_FILE)
    fd = os.open(request + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # DIR is the user's alone
    with os.fdopen(fd, "w") as fh:
        fh.write(name + "\n" + (f"{last_step}\n" if last_step is not None else ""))
    os.replace(request + ".tmp", request)
    asked = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            os.kill(pid, signal.SIGUSR1)
            asked.append(pid)
    return asked


def withdraw_request(folder: str, name: str) -> None:
    """Remove the request file `ask_for_windows` left for dump `name`, once its recorders have
    written (or the wait is over): still there, a later SIGUSR1 would dump under the old name.
    Another request written since (a second snapshot) is left alone."""
    request = os.path.join(folder, REQUEST_FILE)
    with contextlib.suppress(OSError):
        with open(request, encoding="utf-8") as fh:
            if (fh.read().split() or [""])[0] != name:
                return
        os.unlink(request)


def wait_for_windows(dump: str, pids: list[int], timeout: float) -> set[int]:
    """Wait up to `timeout` seconds until each of `pids` has a part in `dump`; the pids that do."""
    deadline = time.monotonic() + timeout
    while True:
        written = dumped_pids(dump)
        if set(pids) <= written or time.monotonic() >= deadline:
            return written & set(pids)
        time.sleep(0.02)


def dumped_pids(dump: str) -> set[int]:
    """The processes with a part in `dump` (a part's name: ROLE-PID-ID.jsonl, traces/parts.py)."""
    if not os.path.isdir(dump):
        return set()
    return {int(entry.split("-")[1]) for entry in os.listdir(dump) if entry.endswith(".jsonl")}


def _core_writers() -> list[Any]:
    from specreplay.traces.parts import _FLUSHER

    return [w for w in list(_FLUSHER.writers) if w.name.startswith("core-")]


def crash_kind(exc: BaseException, scheduler: Any) -> str:
    """`scheduler-assert` for an assert raised inside the scheduler's call (its object is `self`
    in a frame), as a replay names a variant's assert (engines/crash.py); else `engine-crash`."""
    if isinstance(exc, AssertionError) and scheduler is not None:
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_locals.get("self") is scheduler:
                return "scheduler-assert"
            tb = tb.tb_next
    return "engine-crash"


def crash_request(exc: BaseException, scheduler: Any) -> str | None:
    """The client's id of the request the exception names (engines/crash.py), if the scheduler holds it."""
    from specreplay.replay.engines.crash import known_requests, named_request
    from specreplay.replay.families.vllm.attached import client_id

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    frames = [tb.tb_frame] if tb is not None else []  # the frame that raised: its locals
    with contextlib.suppress(Exception):
        found = named_request(exc, frames, known_requests((scheduler,)))
        return client_id(found) if found is not None else None
    return None


def crash_text(exc: BaseException) -> str:
    from specreplay.replay.families.vllm.live import crash_message

    return crash_message(exc)  # type: ignore[arg-type]


def live_recorders(folder: str, run: str | None = None) -> list[int]:
    """The pids of the flight recorders running under `folder` (their markers; stale ones
    skipped), of run `run` only when given."""
    pids = []
    for entry in sorted(os.listdir(folder)):
        pid = _marker_pid(entry)
        if pid is None or not _alive(pid):
            continue
        if run is not None:
            with contextlib.suppress(OSError), open(os.path.join(folder, entry), encoding="utf-8") as fh:
                if fh.read().strip() != run:
                    continue
        pids.append(pid)
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = [
    "ask_for_windows",
    "check_failed",
    "dump_all",
    "dump_name",
    "flight_recorder_started",
    "live_recorders",
    "on_engine_death",
    "sweep",
    "sweep_at_exit",
    "wait_for_windows",
    "withdraw_request",
]
