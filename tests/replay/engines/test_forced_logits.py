"""Forced logits (families/vllm/forced_logits.py): a live vLLM engine samples the oracle's tokens as a
function of the request, position and input id it fed, and a draft model drafts the workload's.

The first tests need no vLLM: the rule on the layouts the runners feed (V1: the persistent batch's
rows and `query_start_loc`; a draft model's passes), the hidden-state encoding in every float
dtype, and the two replaced methods on a small real torch model. The `vllm` ones record live: the
seed re-entry on V1 (the session's `live_reentry_trace`, shared with the other live tests) equals
the reference engine's run of the same workload row for row and has token ground truth (T1 runs,
and finds nothing); one V1 run of 3 small requests whose runner is made to feed one wrong input id
(CORRUPT_ENV) samples wrong tokens from there on, on that request only. MRV2's counterpart of the
first is in test_vllm_live_mrv2.py (on its seed recording); attached runs are never forced:
test_attached.py. Engines started here: one (V1, about 20 s).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specreplay.replay.families.vllm.forced_logits import (
    CORRUPT_ENV,
    DRAFT_PATCH,
    MARGIN,
    TARGET_PATCH,
    ForcedRule,
    decode,
    encode,
    force_model,
    token_requests,
)
from specreplay.replay.workloads import tokens
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import RequestSpec, Workload

CONFIG = EngineConfig(
    max_num_batched_tokens=64,
    max_num_seqs=8,
    num_spec_tokens=3,
    block_size=32,
    num_blocks=64,
    max_model_len=256,
)


def small_workload(acceptance: str = "random:0.6") -> Workload:
    requests = tuple(RequestSpec(rid, arrival_step=1, prompt_len=6, max_tokens=10) for rid in ("0", "1", "2"))
    return Workload(requests, CONFIG, name="forced", seed=3, max_steps=60, acceptance=acceptance)


# ====================================================================== the rule, no vLLM
def v1_step(oracle: Oracle) -> tuple[list[int], list[str], list[int], list[int]]:
    """A V1 step as the runner lays it out: request "1" decoding (its last token and 3 drafts at
    positions 8-11), request "0" prefilling its 6 prompt tokens; rows in persistent-batch order."""
    seq1, seq0 = oracle.expected("1"), oracle.expected("0")
    qsl = [0, 4, 10]
    req_ids = ["1", "0"]
    positions = [8, 9, 10, 11, 0, 1, 2, 3, 4, 5]
    inputs = seq1[8:12] + seq0[0:6]
    return qsl, req_ids, positions, inputs


def test_the_forced_token_is_the_oracles_next_for_what_was_fed():
    workload = small_workload()
    oracle, rule = Oracle(workload), ForcedRule.of_workload(workload)
    qsl, req_ids, positions, inputs = v1_step(oracle)
    rids = token_requests(qsl, req_ids, len(inputs))
    assert rids == ["1"] * 4 + ["0"] * 6
    forced = rule.next_tokens(rids, torch.tensor(positions), torch.tensor(inputs)).tolist()
    # Where the next position is an output (the decode's 4 rows, the prefill's last): the oracle's
    # token there; inside the prompt the model's rule all the same (those logits are not sampled).
    assert [forced[i] for i in (0, 1, 2, 3, 9)] == [oracle.token_at(r, p + 1) for r, p in zip(rids, positions)][:4] + [
        oracle.token_at("0", 6)
    ]
    h = [tokens.request_hash(workload.seed, r) for r in rids]
    assert forced == [tokens.next_token(hr, p, t, workload.config.vocab_size) for hr, p, t in zip(h, positions, inputs)]


def test_a_wrong_input_position_or_request_gives_another_token():
    """The rule reads what was fed: change any one of the three and the forced token changes
    (a rule that ignored its input, or replayed a per-step script, would not)."""
    workload = small_workload()
    oracle, rule = Oracle(workload), ForcedRule.of_workload(workload)
    qsl, req_ids, positions, inputs = v1_step(oracle)
    rids = token_requests(qsl, req_ids, len(inputs))
    right = rule.next_tokens(rids, torch.tensor(positions), torch.tensor(inputs))
    wrong_input = list(inputs)
    wrong_input[1] = (wrong_input[1] + 1) % workload.config.vocab_size  # a stale draft, say
    wrong_position = list(positions)
    wrong_position[0] += 1
    for changed in (
        rule.next_tokens(rids, torch.tensor(positions), torch.tensor(wrong_input)),
        rule.next_tokens(rids, torch.tensor(wrong_position), torch.tensor(inputs)),
        rule.next_tokens(token_requests(qsl, ["0", "1"], len(inputs)), torch.tensor(positions), torch.tensor(inputs)),
    ):
        assert (changed != right).any()
    only = rule.next_tokens(rids, torch.tensor(positions), torch.tensor(wrong_input)) != right
    assert only.tolist() == [False, True] + [False] * 8  # exactly the token fed wrong


def test_padding_and_empty_rows_belong_to_no_request():
    assert token_requests([0, 2, 2, 5], ["a", "b", "c"], 8) == ["a", "a", "c", "c", "c", None, None, None]
    assert token_requests([0, 3], ["a"], 2) == ["a", "a"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_token_survives_the_hidden_states_dtype(dtype):
    hidden = torch.randn(5, 16).to(dtype)
    ids = torch.tensor([0, 1, 511, 151_935, 262_143])
    encode(hidden, ids)
    assert decode(hidden).tolist() == ids.tolist()


@pytest.mark.parametrize("listed", [False, True])
def test_the_drafter_rule_is_the_oracles_drafts_as_a_draft_model_is_fed(listed):
    """A draft model's first pass reads true tokens (the step's and the bonus token), its later
    passes its own proposals, wrong ones included: the rule takes a deliberately wrong proposal
    back before reading it, so every proposal is `Oracle.drafts`' for its position. Listed
    rounds (`acceptance = [...]`) are positions the same way."""
    workload = small_workload("random:0.5")
    if listed:
        rounds = ((2, 0, 3), (0, 0), (3, 1, 1, 2))
        workload = dataclasses.replace(
            workload, requests=tuple(dataclasses.replace(r, acceptance=a) for r, a in zip(workload.requests, rounds))
        )
    oracle, rule = Oracle(workload), ForcedRule.of_workload(workload)
    for rid in ("0", "1", "2"):
        for last in range(5, 20):  # the position of the last true token
            seq = oracle.expected(rid)
            proposals = []
            fed, own = seq[last], False
            for q in range(last, last + 3):
                (d,) = rule.draft_tokens([rid], torch.tensor([q]), torch.tensor([fed]), own).tolist()
                proposals.append(d)
                fed, own = d, True
            assert proposals == oracle.drafts(rid, last + 1, 3), (rid, last)


class TinyLM(torch.nn.Module):
    """A real (if small) language model: embedding plus position, a head for compute_logits."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 16)
        self.pos = torch.nn.Embedding(256, 16)
        self.head = torch.nn.Linear(16, vocab)

    def forward(self, input_ids, positions):
        return self.embed(input_ids) + self.pos(positions)

    def compute_logits(self, hidden_states):
        return self.head(hidden_states)


def test_the_replaced_methods_sample_the_rules_token_at_the_runners_logits_rows():
    workload = small_workload()
    oracle, rule = Oracle(workload), ForcedRule.of_workload(workload)
    qsl, req_ids, positions, inputs = v1_step(oracle)
    model = TinyLM(workload.config.vocab_size)
    force_model(model, lambda ids, pos: rule.next_tokens(token_requests(qsl, req_ids, ids.shape[0]), pos, ids))
    hidden = model(input_ids=torch.tensor(inputs), positions=torch.tensor(positions))
    logits_indices = torch.tensor([0, 1, 2, 3, 9])  # V1's spec-decode rows, then the prefill's last
    logits = model.compute_logits(hidden[logits_indices])
    assert logits.shape == (5, workload.config.vocab_size) and logits.max().item() == MARGIN
    want = [oracle.token_at("1", p) for p in (9, 10, 11, 12)] + [oracle.token_at("0", 6)]
    assert logits.argmax(-1).tolist() == want


# ====================================================================== live, V1
def columns_equal(live, reference, columns: list[str]) -> tuple[bool, str]:
    a = live.table.to_pandas()[columns].astype(str).reset_index(drop=True)
    b = reference.table.to_pandas()[columns].astype(str).reset_index(drop=True)
    if a.equals(b):
        return True, ""
    bad = (a != b).any(axis=1) if len(a) == len(b) else None
    at = int(bad.idxmax()) if bad is not None else min(len(a), len(b))
    return False, f"rows {len(a)} / {len(b)}; first differing row {at}:\n{a.iloc[at : at + 3]}\n{b.iloc[at : at + 3]}"


@pytest.mark.vllm
def test_the_seed_recorded_live_on_v1_is_the_reference_engines_run_row_for_row(live_reentry_trace):
    from specreplay.replay.check.checker import check_trace, unchecked_codes
    from specreplay.replay.check.coverage import kv_truth_codes
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.families.vllm.setup import DRAFT_BUDGET_PATCH
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.scenarios import build_scenario

    live = live_reentry_trace
    assert live.impl.drafter == "draft_model"
    assert {TARGET_PATCH, DRAFT_PATCH, DRAFT_BUDGET_PATCH} <= set(live.impl.patches)
    reference = run_workload(build_scenario("reentry"), resolve("upstream", allow_import=False), runner="v1")
    same, why = columns_equal(
        live,
        reference,
        [
            "step",
            "request_id",
            "sched_kind",
            "sched_num_scheduled_tokens",
            "sched_num_draft_slots",
            "apply_num_tokens",
            "apply_num_rejected",
            "apply_sampled_token_ids",
            "apply_token_mismatches",
            "worker_draft_ids",
        ],
    )
    assert same, why
    # Token ground truth: every applied output counted against the oracle, none wrong; T1 ran.
    df = live.table.to_pandas()
    applied = df[df.apply_outcome == "applied"]
    assert len(applied) > 0 and applied.apply_token_mismatches.notna().all()
    assert (applied.apply_token_mismatches == 0).all()
    assert unchecked_codes(live) == list(kv_truth_codes("v1"))
    assert "T1-wrong-token" not in {f.code for f in check_trace(live)}


@pytest.mark.vllm
def test_a_runner_that_feeds_a_wrong_input_samples_another_token(tmp_path, monkeypatch):
    """The target model reads input id + 1 at request 1's position 8 (a runner's bug, as the test
    hook makes it): the engine samples another token there, and the request's tokens follow the
    wrong one; T1 finds exactly that request, from the step that fed it."""
    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve

    monkeypatch.setenv(CORRUPT_ENV, "1:8")
    trace = run_workload(small_workload("all"), resolve("upstream", allow_import=False), engine="vllm", runner="v1")
    assert trace.outcome.status == "completed", trace.outcome
    df = trace.table.to_pandas()
    wrong = df[df.apply_token_mismatches > 0]
    assert set(wrong.request_id) == {"1"}
    t1 = [f for f in check_trace(trace) if f.code == "T1-wrong-token"]
    assert t1 and {f.request_id for f in t1} == {"1"}
    # Position 8 is fed at the step whose row starts at computed 8 or spans it: the first wrong output.
    fed = df[(df.request_id == "1") & (df.sched_num_computed_tokens <= 8)]
    fed = fed[fed.sched_num_computed_tokens + fed.sched_num_scheduled_tokens > 8]
    assert min(f.step for f in t1) == int(fed.step.min())
