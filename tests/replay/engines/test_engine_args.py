"""vLLM's engine arguments from an EngineConfig are built in one place (vllm_setup.engine_args),
which the live engine, the attached-overhead benchmark and the attached-recording tests call."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specreplay.replay.families.vllm.setup import engine_args
from specreplay.replay.workloads.config import EngineConfig

ROOT = Path(__file__).resolve().parents[3]


def test_every_field_of_the_config_reaches_the_engine():
    config = EngineConfig(
        max_num_batched_tokens=48,
        max_num_seqs=5,
        num_spec_tokens=2,
        async_scheduling=False,
        block_size=32,
        num_blocks=40,
        max_model_len=200,
        long_prefill_token_threshold=8,
        enable_prefix_caching=False,
    )
    args = engine_args(config, seed=7)
    assert args["long_prefill_token_threshold"] == 8  # the copies this replaced dropped it
    assert (args["max_num_batched_tokens"], args["max_num_seqs"], args["max_model_len"]) == (48, 5, 200)
    assert (args["block_size"], args["num_gpu_blocks_override"], args["seed"]) == (32, 40, 7)
    assert args["async_scheduling"] is False and args["enable_prefix_caching"] is False
    assert args["speculative_config"]["method"] == "ngram" and args["speculative_config"]["num_speculative_tokens"] == 2
    assert args["load_format"] == "dummy" and args["dtype"] == "float32"
    with open(os.path.join(args["model"], "config.json")) as fh:  # the tiny model, written on the fly
        assert json.load(fh)["vocab_size"] == config.vocab_size
    assert engine_args(EngineConfig())["enable_prefix_caching"] is True  # vLLM's default, the config's too
    real = engine_args(config, model="/models/mine")
    assert real["model"] == "/models/mine" and real["dtype"] == "auto" and "load_format" not in real


def test_the_arguments_are_built_nowhere_else():
    callers = [
        "replay/families/vllm/live.py",
        "benchmarks/attached_overhead.py",
        "tests/replay/engines/attached_llm.py",
    ]
    for caller in callers:
        assert "engine_args(" in (ROOT / caller).read_text(), caller
    elsewhere = [
        path.relative_to(ROOT).as_posix()
        for folder in ("cli", "replay", "benchmarks", "tests")
        for path in (ROOT / folder).rglob("*.py")
        if path != Path(__file__) and "num_gpu_blocks_override" in path.read_text()
    ]
    assert elsewhere == ["replay/families/vllm/setup.py"]
