"""The part-file format (traces/parts.py): each process's JSON lines, written flushed and read
back whole, a line cut mid-write counted and dropped, the rows patched in step order, and the
readers a merge takes the inputs, the classes that ran and the recorder's failures from."""

from __future__ import annotations

import ast
from pathlib import Path

from specreplay.traces import parts as part_files
from specreplay.traces.parts import (
    PartWriter,
    collect_inputs,
    flush_all,
    merge_rows,
    observer_failures,
    ran_classes,
    read_parts,
)


def test_parts_are_written_and_read_back_line_by_line(tmp_path):
    core = PartWriter(str(tmp_path), "core", {"e": "part", "run": "r1", "role": "core", "pid": 11})
    names = ["step", "request_id", "sched_num_scheduled_tokens"]
    core.write({"e": "rows", "names": names, "rows": [[2, "b", 4], [2, "a", 3]]})
    core.write({"e": "rows", "names": names, "rows": [[1, "a", 8]]})
    core.write({"e": "request", "id": "a", "step": 1, "prompt": [5, 6]})
    core.write({"e": "abort", "id": "a", "step": 2})
    core.write({"e": "ran", "scheduler": "vllm.v1.core.sched.async_scheduler.AsyncScheduler"})
    runner = PartWriter(str(tmp_path), "runner")
    runner.write({"e": "patch", "rows": [[2, "a", {"worker_num_scheduled_tokens": 3}], [9, "x", {"y": 1}]]})
    runner.write({"e": "ran", "runner": "vllm.v1.worker.gpu_model_runner.GPUModelRunner"})
    runner.write({"e": "error", "message": "observer failed"})
    runner.write({"e": "error", "message": "observer failed"})
    flush_all()  # what was queued is on disk: then the process dies writing a line
    with open(runner.path, "a") as fh:
        fh.write('{"e": "patch", "rows": [[1, "a"')  # the process died writing this line

    read = read_parts(str(tmp_path))
    by_role = {p.role: p for p in read}
    assert sorted(by_role) == ["core", "runner"]
    assert by_role["core"].run == "r1" and by_role["core"].cut_lines == 0
    assert by_role["runner"].run is None and by_role["runner"].cut_lines == 1  # no part line: role from its name
    rows = merge_rows(read)
    assert [(r["step"], r["request_id"]) for r in rows] == [(1, "a"), (2, "b"), (2, "a")]  # step order, stable
    assert rows[2]["worker_num_scheduled_tokens"] == 3 and "worker_num_scheduled_tokens" not in rows[1]
    inputs = collect_inputs(read)
    assert inputs == {
        "requests": [{"id": "a", "step": 1, "prompt": [5, 6]}],
        "chunks": [],
        "aborts": [{"id": "a", "step": 2}],
        "events": [],
    }
    assert ran_classes(read) == {
        "scheduler": "vllm.v1.core.sched.async_scheduler.AsyncScheduler",
        "runner": "vllm.v1.worker.gpu_model_runner.GPUModelRunner",
    }
    assert observer_failures(read) == ["runner process ?: observer failed"]  # once per message


def test_a_folder_without_parts_reads_empty(tmp_path):
    (tmp_path / "notes.txt").write_text("not a part")
    assert read_parts(str(tmp_path)) == []


def test_the_format_knows_nothing_of_vllm_or_the_engines():
    """traces/ is the base layer: the format imports the standard library and its own layer only
    (the flight recorder's window, traces/window.py)."""
    tree = ast.parse(Path(part_files.__file__).read_text())
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    outside = {
        name
        for name in imported
        if name and name.startswith("specreplay.") and not name.startswith("specreplay.traces.")
    }
    assert not outside and not {name for name in imported if name and "vllm" in name}


def lines_of(path) -> list[str]:
    with open(path) as fh:
        return [line.rstrip("\n") for line in fh]


def test_writes_are_queued_and_written_by_the_background_thread_in_order(tmp_path):
    """`write` returns at once; the process's writer thread writes the queue within its interval,
    in order; `now=True` writes what is queued first, then the line; the file is the user's alone."""
    import os
    import stat
    import time

    from specreplay.traces.parts import writer_cpu_s

    writer = PartWriter(str(tmp_path), "core", {"e": "part", "run": "r"})
    assert lines_of(writer.path) == ['{"e":"part","run":"r"}']  # the header: at once
    for i in range(200):
        writer.write({"e": "step", "step": i})
    deadline = time.monotonic() + 30
    while len(lines_of(writer.path)) < 201 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lines_of(writer.path)[1:] == [f'{{"e":"step","step":{i}}}' for i in range(200)]
    writer.write({"e": "step", "step": 200})
    writer.write({"e": "error", "message": "m"}, now=True)
    assert lines_of(writer.path)[-2:] == ['{"e":"step","step":200}', '{"e":"error","message":"m"}']
    assert stat.S_IMODE(os.stat(writer.path).st_mode) == 0o600
    assert writer_cpu_s() > 0.0  # the thread wrote the 200 lines: its CPU is read from outside it


def test_an_idle_writer_thread_spends_no_cpu(tmp_path):
    """Nothing queued, nothing woken: the writer thread sleeps on its event (a timer that woke
    every 20 ms cost about 200 us of CPU a wake-up here, 1% of a core for an idle engine)."""
    import time

    from specreplay.traces.parts import writer_cpu_s

    writer = PartWriter(str(tmp_path), "core", {"e": "part", "run": "r"})
    writer.write({"e": "step", "step": 1})
    deadline = time.monotonic() + 30
    while len(lines_of(writer.path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # past the round that wrote it
    before = writer_cpu_s()
    time.sleep(1.0)  # 50 rounds of a 20 ms timer
    assert writer_cpu_s() - before < 0.001
    writer.write({"e": "step", "step": 2})  # and a write still wakes it
    deadline = time.monotonic() + 30
    while len(lines_of(writer.path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lines_of(writer.path)[-1] == '{"e":"step","step":2}'


def test_what_a_process_queued_is_on_disk_when_it_exits_or_forks(tmp_path):
    """A process that exits normally (atexit), a multiprocessing child that returns
    (multiprocessing's finalizers: it skips atexit) and a fork (the parent's queue is written
    before it, so the child never writes it twice) lose nothing and duplicate nothing."""
    import multiprocessing
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import sys
        from specreplay.traces.parts import PartWriter
        w = PartWriter({str(tmp_path)!r}, "exits")
        for i in range(500):
            w.write({{"e": "step", "step": i}})
        sys.exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    (exits,) = tmp_path.glob("exits-*.jsonl")
    assert len(lines_of(exits)) == 500

    writer = PartWriter(str(tmp_path), "parent")
    writer.write({"e": "step", "step": 1})  # queued when the fork comes
    child = multiprocessing.get_context("fork").Process(target=_child_writes, args=(str(tmp_path),))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    writer.write({"e": "step", "step": 2}, now=True)
    assert lines_of(writer.path) == ['{"e":"step","step":1}', '{"e":"step","step":2}']
    (mine,) = tmp_path.glob("child-*.jsonl")
    assert lines_of(mine) == [f'{{"e":"step","step":{i}}}' for i in range(300)]
    assert os.getpid() != int(mine.name.split("-")[1])


def _child_writes(folder: str) -> None:
    child = PartWriter(folder, "child")
    for i in range(300):
        child.write({"e": "step", "step": i})


def test_only_the_last_line_can_be_cut_any_other_bad_line_is_damage(tmp_path):
    """A process killed inside a write leaves a prefix of it and writes nothing more: only its
    last line can be cut. A bad line with lines after it was damaged after it was written
    (`Part.damaged`: the first such line, and what a salvage keeps); the lines after it are read."""
    from specreplay.traces.parts import read_part

    writer = PartWriter(str(tmp_path), "core", {"e": "part", "run": "r", "role": "core"})
    for step in (1, 2, 3):
        writer.write({"e": "step", "step": step})
    writer.close()
    whole = Path(writer.path).read_bytes()
    lines = whole.split(b"\n")  # the header, three steps, and "" after the last newline

    def read(data: bytes):
        Path(writer.path).write_bytes(data)
        return read_part(writer.path)

    cut = read(whole + b'{"e":"step","st')
    assert (cut.cut_lines, cut.damaged, len(cut.events)) == (1, None, 4)
    for bad, why in (
        (lines[2][:5] + b"\0" * 8 + lines[2][13:], "8 NUL byte(s)"),
        (b'{"e":"step","step":\xff}', "not UTF-8"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b"", "not JSON: Expecting value at column 1"),
    ):
        part = read(b"\n".join([lines[0], lines[1], bad, *lines[3:]]))
        assert part.cut_lines == 0 and part.damaged is not None
        assert (part.damaged.line, part.damaged.lines, part.damaged.why) == (3, 4, why)
        assert str(part.damaged) == f"line 3 of 4 is damaged ({why})"
        assert [e.get("step") for e in part.events] == [None, 1, 3]  # read on past it
        part.salvage()
        assert [e.get("step") for e in part.events] == [None, 1]  # what precedes the damage
    last = read(whole + b"\0" * 40 + b"\n")  # the last line, NUL bytes and all: cut, as before
    assert (last.cut_lines, last.damaged) == (1, None)


def test_lines_a_full_disk_lost_are_counted_and_said_and_the_part_stays_whole(tmp_path):
    """A write that fails part way (the disk full: here a file-size limit, RLIMIT_FSIZE, in a
    process of its own) is cut back to the last whole line, so the part never holds half a line
    with lines after it; the next write that goes through puts a `lost` line first, with the count
    and why, and merge says it."""
    import subprocess
    import sys
    import textwrap

    from specreplay.replay.workflows.merge import lost_lines

    script = textwrap.dedent(
        f"""
        import resource, signal
        from specreplay.traces.parts import PartWriter
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        w = PartWriter({str(tmp_path)!r}, "core")
        for i in range(10):
            w.write({{"e": "step", "step": i}})
        w.flush()
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (w._size + 100, hard))
        for i in range(10, 60):  # 50 lines of about 22 bytes: the write stops part way
            w.write({{"e": "step", "step": i}})
        try:
            w.flush()
        except OSError:
            pass
        else:
            raise SystemExit("the write past the limit did not fail")
        assert w.lost_lines == 50, w.lost_lines
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
        w.write({{"e": "step", "step": 60}})
        w.close()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    (part,) = read_parts(str(tmp_path))
    assert part.damaged is None and part.cut_lines == 0
    kinds = [(e["e"], e.get("step")) for e in part.events]
    assert kinds == [*(("step", i) for i in range(10)), ("lost", None), ("step", 60)]
    assert part.events[10]["lines"] == 50 and part.events[10]["why"]
    (note,) = lost_lines([part])
    assert note.startswith(f"{Path(part.path).name}: 50 line(s) lost, never written (")
