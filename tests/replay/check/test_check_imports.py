"""The check package reads traces only: importing the checker and the trace diff loads no torch,
no reference models, engines, recorder or implementations (so checking stays fast, and works
where torch is not installed)."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = (
    "torch",
    "specreplay.replay.models",
    "specreplay.replay.engines",
    "specreplay.replay.observers",
    "specreplay.replay.impls",
)

PROBE = """
import json, sys
import specreplay.replay.check.checker
import specreplay.replay.check.tracediff
print(json.dumps(sorted(sys.modules)))
"""


def test_importing_the_checker_and_the_trace_diff_loads_no_model_engine_or_torch():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "specreplay.replay.check.checker" in loaded and "specreplay.replay.check.tracediff" in loaded
    heavy = [m for m in loaded if any(m == name or m.startswith(name + ".") for name in FORBIDDEN)]
    assert heavy == []
