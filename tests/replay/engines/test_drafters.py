"""`--drafter`: the speculative config each live drafter asks vLLM for (families/vllm/drafters.py), built
without starting an engine; the live recordings are in test_mrv2_drafters.py."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.families.vllm.drafters import DRAFTERS, live_config
from specreplay.replay.families.vllm.setup import engine_args, speculative_config
from specreplay.replay.workloads.config import EngineConfig
from specreplay.traces.errors import InputError

ASYNC, SYNC = EngineConfig(num_spec_tokens=2), EngineConfig(num_spec_tokens=2, async_scheduling=False)


def read_config(folder: str) -> dict:
    with open(os.path.join(folder, "config.json")) as fh:
        return json.load(fh)


def test_the_default_is_todays_ngram_gpu_async_and_ngram_sync():
    for config, method in ((ASYNC, "ngram_gpu"), (SYNC, "ngram")):
        spec = engine_args(config)["speculative_config"]
        assert spec == speculative_config(config)  # the real-scheduler engine's and a served model's
        assert spec == {"method": method, "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    assert engine_args(replace(ASYNC, num_spec_tokens=0))["speculative_config"] is None


def test_eagle_drafts_with_a_one_layer_head_of_the_targets_size():
    args = engine_args(ASYNC, drafter="eagle")
    spec = args["speculative_config"]
    assert spec["method"] == "eagle" and spec["num_speculative_tokens"] == 2
    head, target = read_config(spec["model"]), read_config(args["model"])
    assert spec["model"] != args["model"] and head["num_hidden_layers"] == 1 < target["num_hidden_layers"]
    # EagleLlamaForCausalLM's fc takes the token embedding and the target's hidden state side by side.
    assert {k: v for k, v in head.items() if k != "num_hidden_layers"} == {
        k: v for k, v in target.items() if k != "num_hidden_layers"
    }


def test_draft_model_is_the_target_drafting_for_itself():
    args = engine_args(ASYNC, drafter="draft_model")
    assert args["speculative_config"] == {"method": "draft_model", "num_speculative_tokens": 2, "model": args["model"]}
    real = engine_args(ASYNC, model="/models/mine", drafter="draft_model")
    assert real["speculative_config"]["model"] == "/models/mine"


def test_bad_drafter_choices_are_one_line():
    with pytest.raises(InputError, match=r"^--drafter eagle runs with the tiny dummy-weight model only"):
        engine_args(ASYNC, model="/models/mine", drafter="eagle")
    with pytest.raises(InputError, match=r"^--drafter eagle: the workload drafts nothing \(num_spec_tokens 0\)"):
        engine_args(replace(ASYNC, num_spec_tokens=0), drafter="eagle")
    with pytest.raises(InputError, match=r"^--drafter ngram: vLLM runs the CPU n-gram drafter under synchronous"):
        engine_args(ASYNC, drafter="ngram")
    assert engine_args(SYNC, drafter="ngram")["speculative_config"]["method"] == "ngram"
    with pytest.raises(InputError, match=r"^unknown drafter 'medusa'; known: ngram, ngram_gpu, eagle, draft_model$"):
        engine_args(ASYNC, drafter="medusa")


def test_the_model_drafters_keep_the_lookahead_vllm_reserves_for_them():
    """vLLM reserves k lookahead slots for EAGLE and draft models (VllmConfig.num_lookahead_tokens);
    the plugin gives the live scheduler the config's value, so the config carries vLLM's. An n-gram
    run keeps the workload's (0, or one that models an EAGLE-style drafter's slots). EAGLE is also
    vLLM's use_eagle_block_drop drafter: a prefix-cache hit recomputes its last block."""
    modelled = replace(ASYNC, num_lookahead_tokens=1)
    for drafter in DRAFTERS:
        expected = 2 if drafter in ("eagle", "draft_model") else 1
        eagle = drafter == "eagle"
        assert live_config(modelled, drafter) == replace(
            modelled, num_lookahead_tokens=expected, eagle_block_drop=eagle
        )


@pytest.mark.parametrize("command", ["record", "compare"])
def test_drafter_off_the_live_engine_is_one_line(command, tmp_path):
    out = ["-o", str(tmp_path / "t.parquet")] if command == "record" else ["-o", str(tmp_path)]
    result = CliRunner().invoke(main, [command, "--scenario", "reentry", "--drafter", "eagle", *out])
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.endswith("--drafter is for --engine vllm (a live engine); --engine reference drafts with the oracle")
    assert not list(tmp_path.glob("*.parquet"))


def test_a_forced_live_run_drafts_with_the_draft_model_and_keeps_its_slot_out_of_the_budget():
    """Forced logits (families/vllm/forced_logits.py): the default drafter is the draft model (its draft
    logits follow the workload's rule), and vLLM's one drafting input slot per request is kept
    out of the token budget, which stays the workload's; --drafter still picks, k = 0 drafts
    nothing, and an unforced run's budget is vLLM's as asked."""
    from specreplay.replay.families.vllm.drafters import FORCED_DRAFTER, drafter_for

    assert FORCED_DRAFTER == "draft_model"
    assert drafter_for(ASYNC, None, forced=True) == drafter_for(SYNC, None, forced=True) == "draft_model"
    assert drafter_for(ASYNC, "ngram_gpu", forced=True) == "ngram_gpu"
    assert drafter_for(replace(ASYNC, num_spec_tokens=0), None, forced=True) == "ngram_gpu"  # named, drafts nothing
    forced = engine_args(ASYNC, drafter="draft_model", forced=True)
    budget, seqs = ASYNC.max_num_batched_tokens, ASYNC.max_num_seqs
    assert (forced["max_num_scheduled_tokens"], forced["max_num_batched_tokens"]) == (budget, budget + seqs)
    unforced = engine_args(ASYNC, drafter="draft_model")
    assert "max_num_scheduled_tokens" not in unforced and unforced["max_num_batched_tokens"] == budget
    assert "max_num_scheduled_tokens" not in engine_args(ASYNC, drafter="ngram_gpu", forced=True)
