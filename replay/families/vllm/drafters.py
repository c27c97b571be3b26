"""The drafters a live vLLM engine can run: the speculative config each asks vLLM for, the tiny
draft model it needs, and the lookahead KV slots vLLM reserves for it.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. `vllm_setup.engine_args` builds the live engine's `speculative_config`
here, and `live.run_live` names the drafter in the trace header and gives the plugin the
lookahead the drafter's vLLM scheduler reserves. No vLLM import: the CLI's choices come from here.

  ngram       vLLM's n-gram prompt lookup (V1: on the CPU; MRV2: the same GPU speculator as
              ngram_gpu); synchronous scheduling only in vLLM 0.32 / 0.33
  ngram_gpu   the n-gram lookup on the device; the default under async scheduling
  eagle       an EAGLE head: a 1-layer llama-style draft config written on the fly, dummy weights
  draft_model a separate draft model: the tiny target model drafting for itself (dummy weights);
              the default of a forced live run (FORCED_DRAFTER), whose draft logits follow the
              workload's drafter rule

EAGLE and draft_model draft from KV of positions past the scheduled range, so vLLM reserves k
lookahead slots for them (`VllmConfig.num_lookahead_tokens`, config/vllm.py:615); ngram and
ngram_gpu reserve none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specreplay.replay.workloads.config import EngineConfig
from specreplay.traces.errors import InputError

DRAFTERS = ("ngram", "ngram_gpu", "eagle", "draft_model")
#: The drafters that draft with a model of their own, writing KV past the scheduled range.
MODEL_DRAFTERS = ("eagle", "draft_model")
#: The drafters vLLM counts as EAGLE-style (SpeculativeConfig.use_eagle): hidden states of the
#: target model, so a prefix-cache hit recomputes its last block (use_eagle_block_drop).
EAGLE_DRAFTERS = ("eagle",)


def default_drafter(config: EngineConfig) -> str:
    """What a live run drafts with when not told: ngram_gpu under async scheduling (the only
    n-gram drafter vLLM takes there), ngram under the synchronous Scheduler. (A workload with
    k = 0 drafts nothing; its trace names the drafter it would have had, as it always has.)"""
    return "ngram_gpu" if config.async_scheduling else "ngram"


#: What a forced live run (families/vllm/forced_logits.py) drafts with when not told: the tiny model
#: drafting for itself, its draft logits forced to the workload's drafter rule, so that the real
#: engine's drafts and accepted counts are the workload's (an n-gram drafter rarely matches the
#: oracle's pseudo-random tokens: acceptance would collapse to about 0).
FORCED_DRAFTER = "draft_model"


def drafter_for(config: EngineConfig, drafter: str | None, forced: bool = False) -> str:
    """The drafter a live run of `config` runs: `drafter` (a `--drafter` value) or the default
    (`forced`: a forced live run's, FORCED_DRAFTER, when the workload drafts)."""
    if drafter is None:
        return FORCED_DRAFTER if forced and config.num_spec_tokens else default_drafter(config)
    if drafter not in DRAFTERS:
        raise InputError(f"unknown drafter {drafter!r}; known: {', '.join(DRAFTERS)}")
    if not config.num_spec_tokens and drafter != default_drafter(config):  # the default: named, drafts nothing
        raise InputError(f"--drafter {drafter}: the workload drafts nothing (num_spec_tokens 0); give it a k")
    if drafter == "ngram" and config.async_scheduling:
        # vLLM refuses it too (config/vllm.py:1563), but only once the engine is being built.
        raise InputError(
            "--drafter ngram: vLLM runs the CPU n-gram drafter under synchronous scheduling only; "
            "use --drafter ngram_gpu, or a workload with async_scheduling = false"
        )
    return drafter


def lookahead_tokens(drafter: str, k: int) -> int:
    """The KV slots past each scheduled range vLLM reserves for `drafter` with k drafts: k for
    EAGLE and draft models, 0 for the n-gram drafters (config/vllm.py:615-641)."""
    return k if drafter in MODEL_DRAFTERS else 0


def live_config(config: EngineConfig, drafter: str) -> EngineConfig:
    """The engine config a live run with `drafter` has. The plugin gives the live scheduler the
    config's `num_lookahead_tokens` (so an n-gram run can model an EAGLE-style drafter's slots);
    for a drafter that reserves its own, that is vLLM's value, so the plugin keeps what vLLM set
    and the trace's config says what ran. An EAGLE head is also vLLM's `use_eagle_block_drop`
    drafter (the prefix cache's rule for a hit's last block: `eagle_block_drop`)."""
    if drafter not in MODEL_DRAFTERS:
        return config
    return dataclasses.replace(
        config,
        num_lookahead_tokens=lookahead_tokens(drafter, config.num_spec_tokens),
        eagle_block_drop=drafter in EAGLE_DRAFTERS,
    )


def speculative_config(config: EngineConfig, drafter: str, target: str, draft_folder: Any = None) -> dict | None:
    """vLLM's `speculative_config` for `drafter` with the config's k. `target`: the target
    model's folder or hub name (a draft model drafts with it); `draft_folder(overrides)`: writes
    a tiny model config with `overrides` and returns its folder (EAGLE's head)."""
    if not config.num_spec_tokens:
        return None
    doc: dict[str, Any] = {"method": drafter, "num_speculative_tokens": config.num_spec_tokens}
    if drafter in ("ngram", "ngram_gpu"):
        doc.update(prompt_lookup_min=1, prompt_lookup_max=3)
    elif drafter == "draft_model":
        doc["model"] = target
    elif drafter == "eagle":
        if draft_folder is None:
            raise InputError("--drafter eagle runs with the tiny dummy-weight model only (its head has no weights)")
        doc["model"] = draft_folder(EAGLE_HEAD)
    return doc


#: EAGLE's head as vLLM's EagleLlamaForCausalLM builds it (model_executor/models/llama_eagle.py):
#: the target's hidden size (its fc takes the token embedding and the target's hidden state side
#: by side), one decoder layer. vLLM wraps the llama config in its EAGLEConfig itself.
EAGLE_HEAD = {"num_hidden_layers": 1}
