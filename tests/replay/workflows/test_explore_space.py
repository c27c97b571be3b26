"""explore searches the whole space (issue 21): its workloads draw every engine setting the
reference models honour (k 0 to 8, lookahead slots, block sizes 16/32/64 and smaller,
max_model_len tight to the requests, tight KV), only ones the implementation applies to, and its
coverage names the situations near the end of the model length (the drafter skipped for the whole
batch, draft slots fed the zeros it left, drafts cut) and lookahead allocation, each reached
within one generation of the seeded search."""

from __future__ import annotations

import pytest

from specreplay.replay.check.situations import SITUATIONS, settings, situations
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.v1.runner import GPUModelRunner
from specreplay.replay.impls import resolve
from specreplay.replay.models.scheduler import AsyncScheduler, Scheduler
from specreplay.replay.workflows.explore import (
    GENERATION,
    PROFILES,
    Candidate,
    candidate_workload,
    candidates_for,
    explore,
)
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import RequestSpec, Workload
from specreplay.traces.errors import InputError

NEW = ("drafter-skipped", "skipped-drafts-verified", "drafts-cut-at-max-model-len", "lookahead-allocation")
BUDGET = GENERATION  # the smallest budget that reaches every one of them on seed 0 (one generation)
HERE = "tests.replay.workflows.test_explore_space"


class SyncOnly(Scheduler):
    """A user's synchronous scheduler: explore must give it synchronous workloads only."""


class AsyncOnly(AsyncScheduler):
    """A user's async scheduler: explore must give it async workloads only."""


@pytest.fixture(scope="module")
def upstream():
    return explore("upstream", budget=BUDGET, seed=0)


def test_the_new_situations_are_reached_within_one_generation(upstream):
    assert set(NEW) <= set(upstream.coverage), sorted(upstream.coverage)
    assert set(NEW) <= set(SITUATIONS)


def test_the_search_draws_every_engine_setting(upstream):
    drawn = set(upstream.settings)
    assert {f"k={k}" for k in range(9)} <= drawn, sorted(drawn)
    assert {"block_size=16", "block_size=32", "block_size=64"} <= drawn
    assert {"lookahead=0", "lookahead=k", "lookahead=k+1", "lookahead=1..k-1"} <= drawn
    assert {"async", "sync", "max_model_len=tight", "max_model_len=roomy"} <= drawn
    for name, count in upstream.settings.items():
        assert count == sum(name in r.settings for r in upstream.results), name
    # tight KV: some workload's cache holds little more than its longest request
    assert any(r.features & {"preempt-in-flight", "resume"} for r in upstream.results)


@pytest.mark.parametrize(
    "impl, mode",
    [("sched-clear", True), (f"{HERE}:AsyncOnly", True), (f"{HERE}:SyncOnly", False)],
)
def test_an_implementation_gets_only_the_workloads_it_applies_to(impl, mode):
    implementation = resolve(impl, allow_import=True)
    for candidate in candidates_for(0, 0, {p: 1.0 for p in PROFILES}, 0, 48):
        workload = candidate.workload(implementation)
        assert workload.config.async_scheduling is mode, candidate
        assert implementation.why_not(workload.config) is None
        assert workload == candidate.workload(implementation)  # a seed still names one workload


def test_a_user_scheduler_explores_in_its_own_mode_without_errors():
    result = explore(f"{HERE}:SyncOnly", budget=8, seed=0)
    assert not [r.error for r in result.results if r.error]
    assert set(result.settings) >= {"sync"} and "async" not in result.settings
    assert all("sync" not in r.profiles for r in explore(f"{HERE}:AsyncOnly", budget=8, seed=0).results)


def test_draft_slot_runner_variants_never_get_workloads_without_drafts():
    implementation = resolve("pr30796", allow_import=False)
    ks = {Candidate(i, seed, ()).workload(implementation).config.num_spec_tokens for i, seed in enumerate(range(200))}
    assert 0 not in ks and len(ks) == 8  # every other k still drawn
    assert 0 in {candidate_workload(seed, ()).config.num_spec_tokens for seed in range(200)}


def test_a_seed_no_draw_of_which_applies_is_an_error_that_says_why():
    with pytest.raises(InputError, match="no workload drawn for seed 3 applies.*never"):
        candidate_workload(3, ("burst",), lambda config: "never")


def test_drafter_skipped_is_the_runners_own_rule(monkeypatch):
    """The situation is derived from the columns; the runner's skip is what it must agree with."""
    skipped: list[bool] = []
    propose = GPUModelRunner.propose_drafts

    def watched(self, inputs, emitted, discarded):
        fits = max(inputs.seq_lens, default=0) + self.k <= self.config.max_model_len
        skipped.append(bool(self.k) and not fits and not all(discarded))
        return propose(self, inputs, emitted, discarded)

    monkeypatch.setattr(GPUModelRunner, "propose_drafts", watched)
    implementation = resolve("upstream", allow_import=False)
    hits = 0
    for candidate in candidates_for(5, 0, {p: 1.0 for p in PROFILES}, 0, 24):
        skipped.clear()
        reached = "drafter-skipped" in situations(run_workload(candidate.workload(implementation), implementation))
        assert reached == any(skipped), candidate
        hits += reached
    assert 0 < hits < 24


def _one_request(**config) -> Workload:
    base = {"max_num_batched_tokens": 16, "max_num_seqs": 2, "num_blocks": 20, "block_size": 4}
    requests = (RequestSpec("0", 1, prompt_len=6, max_tokens=10), RequestSpec("1", 1, prompt_len=3, max_tokens=8))
    return Workload(requests, EngineConfig(**{**base, **config}), name="space", seed=1, acceptance="all")


@pytest.mark.parametrize(
    "config, reached, not_reached",
    [
        ({"num_spec_tokens": 3, "max_model_len": 16}, {"drafter-skipped", "skipped-drafts-verified"}, set()),
        ({"num_spec_tokens": 3, "max_model_len": 256}, set(), {"drafter-skipped", "drafts-cut-at-max-model-len"}),
        ({"num_spec_tokens": 2, "num_lookahead_tokens": 3}, {"lookahead-allocation"}, set()),
        ({"num_spec_tokens": 2, "num_lookahead_tokens": 0}, set(), {"lookahead-allocation"}),
        ({"num_spec_tokens": 0, "max_model_len": 16}, set(), {"drafter-skipped", "skipped-drafts-verified"}),
    ],
)
def test_the_situations_of_a_small_run(config, reached, not_reached):
    found = situations(run_workload(_one_request(**config), resolve("upstream", allow_import=False)))
    assert reached <= found and not (not_reached & found), sorted(found)


def test_settings_name_the_draws():
    config = EngineConfig(num_spec_tokens=4, num_lookahead_tokens=5, block_size=32, max_model_len=30).to_dict()
    assert settings(config, longest_request=28) == {
        "async",
        "k=4",
        "block_size=32",
        "lookahead=k+1",
        "max_model_len=tight",
    }
    assert "max_model_len=roomy" in settings({**config, "max_model_len": 256}, longest_request=28)
    assert "lookahead=1..k-1" in settings({**config, "num_lookahead_tokens": 2})
