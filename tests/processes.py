"""The processes a test starts, found and stopped: what lets a harness stop its server on every
exit path and the suite hold that no process outlives its test.

Where it sits: tests only (tests/live_serve.py and tests/conftest.py use it). Linux: it reads
/proc. A server may start processes in sessions of their own (`specreplay record --attach`
runs its command in a new session, and vLLM's API server starts an engine core and a worker),
so killing one process group is not enough: `kill_tree` kills every descendant, found before
the first signal (a killed parent's children are reparented and no longer found through it).

Every process a test starts inherits two variables: pytest's `PYTEST_CURRENT_TEST` (the test's
node id and phase) and `OWNER_ENV`, which this test run sets once to a token of its own (other
pytest runs on the same machine run the same node ids). `started_during` finds the live ones a
phase of a test started, wherever they were reparented.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

OWNER_ENV = "PYTEST_PROCESS_OWNER"  # not SPECREPLAY_*: the served tests strip those from a server's environment


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[2])


def alive(pid: int) -> bool:
    """Running and not a zombie (a zombie holds no memory; its parent reaps it)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), in any session or group."""
    children: dict[int, list[int]] = {}
    for other in _all_pids():
        stat = _stat(other)
        if stat is not None and stat[0] not in ("Z", "X"):
            children.setdefault(stat[1], []).append(other)
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def group_members(pgid: int) -> tuple[int, ...]:
    """Live (not zombie) processes of process group `pgid`."""
    members = []
    for pid in _all_pids():
        stat = _stat(pid)
        if stat is not None and stat[2] == pgid and stat[0] not in ("Z", "X"):
            members.append(pid)
    return tuple(sorted(members))


def kill_tree(pids: list[int] | tuple[int, ...]) -> None:
    """SIGKILL each process and its process group (a group a process leads holds the helpers it
    forked without a new session)."""
    for pid in pids:
        stat = _stat(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if stat is not None and stat[2] == pid:
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pids: list[int] | tuple[int, ...], grace: float) -> tuple[int, ...]:
    """Wait up to `grace` seconds for `pids` to exit; the ones still alive."""
    deadline = time.monotonic() + grace
    while (left := tuple(p for p in pids if alive(p))) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def started_during(owner: str, current_test: str) -> list[int]:
    """Live processes of this test run (`OWNER_ENV` == `owner`) started while
    `PYTEST_CURRENT_TEST` read `current_test` (e.g. "tests/x.py::test_y (call)"), this process
    and its ancestors aside."""
    mine = {os.getpid(), os.getppid()}
    found = []
    for pid in _all_pids():
        if pid in mine or not alive(pid):
            continue
        env = environ(pid)
        if env.get(OWNER_ENV) == owner and env.get("PYTEST_CURRENT_TEST") == current_test:
            found.append(pid)
    return sorted(found)


#: Processes a test may leave that live as long as the pytest process by design, not leaks.
LONG_LIVED = (
    "multiprocessing.resource_tracker",  # one per process that used a semaphore, until it exits
    "multiprocessing.forkserver",
    "torch/_inductor/compile_worker",  # inductor's pool of compile workers, kept for the next compile
)


def kill_outliving(owner: str, current_test: str, grace: float = 10.0) -> list[str]:
    """The processes `current_test` started that are still alive `grace` seconds on (pid and
    command line each), killed; [] when none. What the autouse fixture in conftest.py fails on."""
    left = [p for p in started_during(owner, current_test) if not any(name in cmdline(p) for name in LONG_LIVED)]
    left = list(wait_gone(left, grace))  # one stopped at the test's end may take a moment to exit
    described = [f"{pid} {cmdline(pid)[:200]}" for pid in left]
    kill_tree(left)
    return described
