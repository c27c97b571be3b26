"""vLLM 0.34.0 as the reference models follow it (families/vllm/releases/v0_34.py): no Model Runner
V1, resumed requests admitted in order among the new ones, MRV2's draft handler keeping every
live request's width. Each rule is shown where it changes a run; no vLLM needed (the real 0.34.0
scheduler is held to the same runs in its own environment: scripts/vllm-0.34.sh test)."""

from __future__ import annotations

from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.models.scheduler import Scheduler
from specreplay.replay.workloads.scenarios import build_scenario, reentry, reentry_sync

UPSTREAM = resolve("upstream", allow_import=False)


def test_a_0_34_run_builds_model_runner_v2_and_v1_is_refused_in_one_line(tmp_path):
    trace = run_workload(reentry().at_version("0.34.0"), UPSTREAM)
    assert trace.impl.runner_family == "v2" and trace.outcome.status == "completed"
    cli = CliRunner()
    asked = ["record", "--scenario", "reentry", "--vllm-version", "0.34.0", "--runner", "v1", "-o", str(tmp_path / "x")]
    refused = cli.invoke(main, asked)
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1
    assert "--runner v1 (vLLM's V1 GPUModelRunner) is not in vLLM 0.34.0" in refused.output
    assert "pass --runner v2, or --vllm-version 0.33.0" in refused.output
    variant = cli.invoke(main, [*asked[:-4], "--impl", "pr30796", "-o", str(tmp_path / "y")])
    assert variant.exit_code == 2 and "vLLM 0.34.0 has no Model Runner V1" in variant.output


def test_a_v1_recording_does_not_rerun_as_0_34(tmp_path):
    v1 = tmp_path / "v1.parquet"
    assert CliRunner().invoke(main, ["record", "--scenario", "reentry", "-o", str(v1)]).exit_code == 0
    rerun = CliRunner().invoke(main, ["replay", str(v1), "--vllm-version", "0.34.0", "-o", str(tmp_path / "r")])
    assert rerun.exit_code == 2 and "is not in vLLM 0.34.0" in rerun.output


def test_resumed_requests_take_their_slots_in_admission_order_from_0_34():
    """Random seed 4: at step 14 request 3 (preempted) resumes in the same step as new request 4.
    0.33.0 sends the resumed one after the new ones, 0.34.0 in admission order, so MRV2's free
    list gives request 3 another slot; nothing else differs."""
    workload = build_scenario("random", 4)
    before = run_workload(workload.at_version("0.33.0"), UPSTREAM, runner="v2")
    after = run_workload(workload.at_version("0.34.0"), UPSTREAM)
    diff = diff_traces(before, after)
    assert (diff.first.step, diff.first.request_id, diff.first.field) == (14, "3", "worker_slot")
    assert set(diff.fields) <= {"worker_slot", "worker_slot_prev_owner", "worker_slot_last_write_step"}


class DraftIntake(Scheduler):
    """Upstream's synchronous Scheduler, noting which requests each draft hand-back names."""

    handed: list[list[str]] = []

    def update_draft_token_ids(self, req_ids, drafts):
        type(self).handed.append(list(req_ids))
        super().update_draft_token_ids(req_ids, drafts)


def test_mrv2_hands_back_every_live_request_s_draft_width_from_0_34():
    """Synchronous re-entry: request 10 is skipped by the budget at steps 2-3. 0.33.0's MRV2 hands
    back the last batch's drafts only; 0.34.0's keeps request 10's width while it waits and hands
    it back every step (the scheduler's spec list stays [-1] * k either way: the same trace)."""
    handed = {}
    for version in ("0.33.0", "0.34.0"):
        DraftIntake.handed = []
        impl = Implementation("intake", "notes the draft hand-back", scheduler=DraftIntake)
        trace = run_workload(reentry_sync().at_version(version), impl, runner="v2")
        assert trace.outcome.status == "completed"
        handed[version] = DraftIntake.handed
    assert "10" not in handed["0.33.0"][1] and "10" in handed["0.34.0"][1]
    assert all(set(h) <= set(later) for h, later in zip(handed["0.33.0"], handed["0.34.0"]))
