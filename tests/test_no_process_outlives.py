"""No process outlives its test: a harness left by a failed assertion kills every process of its
server (descendants in sessions of their own included, as `specreplay record --attach` starts
them), and what a test leaves behind is found, however it was reparented, killed and named
(the autouse fixture in conftest.py fails the test on it). Cheap stand-ins for a server: the
mechanism is the same for `vllm serve`, whose leaked API server once held 600 MB after a run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.live_serve import SERVE_CONFIG, Server
from tests.processes import OWNER_ENV, alive, descendants, kill_outliving

# A server-shaped tree: a helper in the API server's own group (as vLLM's engine core is) and a
# server in a session of its own (as `record --attach` runs its command), each sleeping.
TREE = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
print("up", flush=True)
time.sleep(300)
"""


def test_leaving_a_server_by_a_failed_assertion_kills_its_every_process(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    server = Server(process, "http://127.0.0.1:0", SERVE_CONFIG, "", str(tmp_path / "log"), [], str(tmp_path))
    assert process.stdout.readline() == "up\n"
    tree = descendants(process.pid)
    assert len(tree) == 2
    with pytest.raises(AssertionError), server:
        raise AssertionError("the test's body fails")
    assert server.exit is not None and server.exit.signal == "SIGKILL"
    time.sleep(0.5)  # the orphans' reaping by init
    assert [pid for pid in [process.pid, *tree] if alive(pid)] == []


def test_a_process_a_test_leaves_is_found_killed_and_named():
    # The parent exits at once: the sleeper is an orphan, reparented away from this process.
    code = "import subprocess as s; s.Popen(['sleep', '301'], stdout=s.DEVNULL, start_new_session=True)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    left = kill_outliving(os.environ[OWNER_ENV], os.environ["PYTEST_CURRENT_TEST"], grace=0.5)
    assert len(left) == 1 and left[0].endswith("sleep 301"), left
    pid = int(left[0].split()[0])
    time.sleep(0.5)
    assert not alive(pid)
    # Nothing else of this test is left, and none of another test's.
    assert kill_outliving(os.environ[OWNER_ENV], os.environ["PYTEST_CURRENT_TEST"], grace=0.0) == []
