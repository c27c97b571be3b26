"""A flight recorder snapshotted after its vLLM went idle, then stopped cleanly, end to end on V1.

The program (idle_snapshot_llm.py, through tests/traces/make_idle_snapshot.py) is an in-process
vLLM user: its window ends on a step that schedules nothing and a step that only announces the
last finish. The snapshot merges whole (nothing cut as a crash), and the clean stop leaves
nothing in the folder but the dump: no `window-PID.live` marker, no `snapshot.request`.
Marked `vllm`; the real dumps of both runners are tests/traces/data/idle-snapshot-*/
(tests/traces/test_idle_snapshot.py).
"""

from __future__ import annotations

import pytest

from tests.traces.make_idle_snapshot import snapshot_of_idle_program

pytestmark = pytest.mark.vllm


def test_an_idle_snapshot_merges_whole_and_a_clean_stop_leaves_no_marker(tmp_path):
    from specreplay.replay.workflows.merge import merge_folder

    dump = snapshot_of_idle_program(tmp_path, "v1", idle_s=1.0)
    assert sorted(p.name for p in dump.parent.iterdir()) == [dump.name]
    merged = merge_folder(dump)
    assert merged.dropped == [] and merged.trace.outcome.status == "completed"
    rows = merged.trace.table.to_pylist()
    last = max(r["step"] for r in rows)
    assert [r["sched_status"] for r in rows if r["step"] == last] == ["finished"]  # the announcement, kept
