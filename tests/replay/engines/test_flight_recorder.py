"""The flight recorder on a real `vllm serve` under real clients: a window in memory, written out on
SIGUSR1 (`specreplay snapshot`) while the server serves on, and on the engine's death; each dump
merges into a trace that replays step for step and, for the crash, shrinks to a pytest that fails
on the variant and passes on upstream.

The server runs a scheduler variant of its own (`--scheduler-cls`, tests/replay/engines/
overrun_variant.py: an assert on a request's output length) on each runner, as a user picks it
(V1; Model Runner V2 with Triton's interpreter on a CPU); traffic comes in
waves from the `openai` client, the last with one request long enough to trip the assert. The
window is smaller than the run, so the crash dump has dropped the first waves' steps and starts
where the engine went idle before the last one. Marked `vllm`.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.families.vllm.attached import RECORD_ENV
from specreplay.traces.online_checks import DUMP_ON_ENV
from specreplay.traces.window import NOT_REPRODUCED_BY_A_WINDOW, WINDOW_ENV
from tests.live_serve import plan_openai_requests, run_openai_clients, start_server
from tests.replay.engines.overrun_variant import LIMIT

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[3]
IMPL = "tests.replay.engines.overrun_variant:IMPL"
SERVED = "tests.replay.engines.overrun_variant.ServedOverrun"
#: Per runner: the window (steps: more than the last wave takes, less than the run) and the
#: requests per wave. Model Runner V2 steps at about 0.4 s here (Triton's kernels interpreted):
#: smaller waves, a smaller window.
TRAFFIC = {"v1": (40, 8), "v2": (30, 4)}


def wave(prefix: str, n: int, seed: int) -> list:
    """`n` openai requests, none long enough to trip the variant's assert, no disconnects."""
    plans = plan_openai_requests(n, 0, seed=seed, prefix=prefix)
    return [dataclasses.replace(p, max_tokens=min(p.max_tokens, LIMIT - 4)) for p in plans]


def served(folder: Path, tmp_path: Path, runner: str):
    """`vllm serve` on the runner a user picks (MRV2 on a CPU: with Triton's interpreter on from
    the start), recording into `folder` with a window, running the variant scheduler."""
    env = {
        RECORD_ENV: str(folder),
        WINDOW_ENV: str(TRAFFIC[runner][0]),
        # Two online checks that nothing in this traffic may fail (no dump of theirs is asserted).
        DUMP_ON_ENV: "negative-placeholders,lost-tokens",
        "VLLM_USE_V2_MODEL_RUNNER": "1" if runner == "v2" else "0",
        "TRITON_INTERPRET": "1" if runner == "v2" else None,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    workdir = tmp_path / "serve"
    workdir.mkdir()
    extra = ("--scheduler-cls", SERVED)
    return start_server(cpu_patches=False, env=env, extra_args=extra, workdir=str(workdir))


def merged(dump: Path, out: Path):
    from specreplay.traces.io import read_trace

    result = CliRunner().invoke(main, ["merge", str(dump), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return read_trace(out), result.output


#: Model Runner V2's slot identities at a window: which slot a request takes depends on the order
#: the requests before the window left the slot allocator's free list in, which no window holds
#: (docs/recording.md, what a window replays); every other column must be as recorded. The trace
#: diff reports them apart (`not_reproduced`), never in `fields`: asserted below.
SLOT_HISTORY = set(NOT_REPRODUCED_BY_A_WINDOW)


def replays_step_exact(trace_path: Path, out_dir: Path, impl: str, ignore: set[str] = frozenset()) -> dict:
    """Per replay engine, the fields in which a replay of `trace_path` through `impl` differs
    from it, less `ignore` (empty: none), with the first differences."""
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.workflows.record import replay_to
    from specreplay.replay.workflows.replaying import REPLAY_ENGINES
    from specreplay.traces.io import read_trace

    found = {}
    for engine in REPLAY_ENGINES:
        replayed = replay_to(out_dir / f"{trace_path.stem}-{engine}.parquet", trace_path, impl, engine=engine)
        diff = diff_traces(read_trace(trace_path), replayed.trace)
        assert not set(diff.fields) & SLOT_HISTORY  # a window's trace: reported apart, never a difference
        differing = set(diff.fields) - set(ignore)
        found[engine] = {field: [str(f) for f in diff.findings if f.field == field][:1] for field in differing}
    return found


def wait_for_dump(folder: Path, prefix: str, timeout: float) -> Path | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dumps = [d for d in folder.glob(f"{prefix}-*") if d.is_dir() and any(d.glob("*.jsonl"))]
        if dumps:
            return dumps[0]
        time.sleep(0.2)
    return None


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_served_vllm_dumps_its_window_on_request_and_when_it_dies(tmp_path, runner):
    folder, per_wave = tmp_path / "rec", TRAFFIC[runner][1]
    with served(folder, tmp_path, runner) as server:
        server.wait_ready()
        server.warm_up()
        for i in range(3):
            clients = run_openai_clients(server, wave(f"w{i}-", per_wave, seed=i), timeout=240)
            assert not [c.error for c in clients if c.error], [c.error for c in clients if c.error]
            assert server.wait_idle(60)
            if i == 0:  # a snapshot while the server serves: it goes on serving the next waves
                snap = CliRunner().invoke(main, ["snapshot", str(folder)])
                assert snap.exit_code == 0, snap.output
        assert not list(folder.glob("*.jsonl"))  # nothing written but on a dump: a window lives in memory
        # The last wave: one request asks for more tokens than the variant allows; the engine dies.
        long = dataclasses.replace(wave("boom-", 1, seed=9)[0], max_tokens=2 * LIMIT)
        last = run_openai_clients(server, [*wave("w3-", 4, seed=3), long], timeout=240)
        crash = wait_for_dump(folder, "crash", timeout=120)
        assert crash is not None, server.log_tail()
        assert [c for c in last if c.plan.request_id == "boom-0"][0].error is not None
        server.kill()
    log = server.log_text()
    # vLLM's own crash path went on: its error, as vLLM logs it, after specreplay's one line.
    assert f"has run past {LIMIT} output tokens" in log and "EngineCore encountered a fatal error" in log
    assert "specreplay: flight recorder (crash)" in log
    assert not list(folder.glob("check-*"))  # no online check failed on the real traffic
    for path in [folder, *folder.rglob("*")]:  # owner-only, whatever the umask
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))

    # The snapshot: an ordinary trace of the first wave, which replays step for step.
    snapshot = next(d for d in folder.glob("snapshot-*") if d.is_dir())
    snap_trace, _ = merged(snapshot, tmp_path / "snapshot.parquet")
    assert {r["id"] for r in snap_trace.inputs.requests} >= {f"w0-{i}" for i in range(per_wave)}
    assert snap_trace.impl.runner_family == runner
    ignore = SLOT_HISTORY if runner == "v2" else set()
    assert replays_step_exact(tmp_path / "snapshot.parquet", tmp_path, IMPL) == {"reference": {}, "vllm-scheduler": {}}

    # The crash: the window dropped the first waves' steps and starts where the engine went idle.
    trace, output = merged(crash, tmp_path / "crash.parquet")
    assert "window: steps" in output and trace.impl.window.split()[1].split("..")[0] != "1", output
    # From the earliest idle step the window kept on (the longest stretch that replays): the first
    # wave's steps were dropped, the last wave and its long request are in. Every wave after the
    # one the cut falls in is whole (the waves are sent one after another, the engine idle
    # between them). The cut's own wave is whole too when its clients reached the server
    # together; on a loaded machine they can trickle in, the engine can go idle between them,
    # and the window then starts at that idle step, inside the wave: its later requests only.
    ids = {r["id"] for r in trace.inputs.requests}
    waves = {i: {f"w{i}-{j}" for j in range(per_wave if i < 3 else 4)} for i in range(4)}
    kept = [i for i in waves if waves[i] & ids]
    assert 0 not in kept and 3 in kept and "boom-0" in ids, sorted(ids)
    assert ids <= {"boom-0"}.union(*waves.values()), sorted(ids)
    assert all(waves[i] <= ids for i in kept if i > kept[0]), sorted(ids)
    assert trace.outcome.status == "crashed" and trace.outcome.kind == "scheduler-assert"
    assert f"has run past {LIMIT} output tokens" in trace.outcome.message
    # The request the crash is about, by the client's id (vLLM's message names the engine's).
    assert trace.outcome.request == "boom-0"
    same = replays_step_exact(tmp_path / "crash.parquet", tmp_path, IMPL, ignore)
    assert same == {"reference": {}, "vllm-scheduler": {}}

    # Shrunk to a regression test that fails on the variant and passes on upstream.
    test_file = tmp_path / "test_min.py"
    shrunk = CliRunner().invoke(
        main,
        ["shrink", str(tmp_path / "crash.parquet"), "--impl", IMPL, "--code", "E1-engine-crash"]
        + ["-o", str(tmp_path / "min.parquet"), "--emit-pytest", str(test_file)],
    )
    assert shrunk.exit_code == 0, shrunk.output

    def pytest_on(impl: str) -> int:
        env = {**os.environ, "SPECREPLAY_IMPL": impl, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True).returncode

    assert pytest_on(IMPL) == 1
    assert pytest_on("upstream") == 0
