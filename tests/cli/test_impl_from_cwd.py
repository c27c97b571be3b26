"""`--impl module:attr` finds a module in the working directory through the installed
`specreplay` console script (which, unlike `python -m`, does not put it on sys.path): the
README's `myfix.py` example, run as a user runs it."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "specreplay"

MYFIX = '''
from specreplay.replay.models.scheduler import AsyncScheduler


class ClearOnSkip(AsyncScheduler):
    """Clear stale placeholders of requests the running loop did not schedule."""

    def update_after_schedule(self, out):
        super().update_after_schedule(out)
        for req in self.running:
            if req.request_id not in out.num_scheduled_tokens:
                req.spec_token_ids = []
'''


@pytest.mark.skipif(not SCRIPT.exists(), reason="the specreplay console script is not installed beside this Python")
def test_a_module_in_the_working_directory_loads_through_the_console_script(tmp_path):
    (tmp_path / "myfix.py").write_text(MYFIX)
    done = subprocess.run(
        [str(SCRIPT), "record", "--scenario", "reentry", "--impl", "myfix:ClearOnSkip", "-o", "mine.parquet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr  # 1: findings; never 2 "cannot import"
    assert "cannot import" not in done.stderr and (tmp_path / "mine.parquet").exists()
    assert (
        "via myfix:ClearOnSkip"
        in subprocess.run(
            [str(SCRIPT), "info", "mine.parquet"], cwd=tmp_path, capture_output=True, text=True, timeout=120
        ).stdout
    )
