"""Drive a tiny live vLLM engine through a workload and return its recorded trace.

Where it sits: **record** for `--engine vllm`. Builds `vllm.LLM` from the workload's engine config
(dummy weights, a tiny model config written on the fly, no tokenizer, no hub), feeds it the
workload's requests at their arrival steps and its aborts, steps it to the end, and merges the
parts that the taps of `replay/vllm_live.py` wrote into one trace. `--executor inproc` keeps the
engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0); `multiproc` runs it, and on a
CPU the worker too, in processes of their own, each writing its part.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import time
from typing import Any

from specreplay.replay.engines import plugin as vllm_live
from specreplay.replay.impls.registry import Implementation
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError
from specreplay.traces.trace import Trace


def run_live(workload: Workload, impl: Implementation, device: str = "cpu", model: str | None = None) -> Trace:
    """`model`: a model folder or hub name with real weights; None: the tiny dummy-weight model."""
    from specreplay.replay.engines.real_scheduler import load_vllm, sampling_params, speculative_config, tiny_model_dir

    if impl.name not in vllm_live.LIVE_IMPLS:
        raise InputError(f"--engine vllm runs {', '.join(vllm_live.LIVE_IMPLS)}; {impl.name} has no live form")
    if workload.events:
        raise InputError(f"--engine vllm does not drive control events yet ({len(workload.events)} in this workload); "
                         "use --engine vllm-scheduler, which calls the real scheduler's pause, reset and abort methods")
    vllm = load_vllm()
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    config = cpu_attention_config(workload.config) if on_cpu else workload.config
    sink = vllm_live.new_sink()
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if impl.executor == "multiproc" else "0",
        vllm_live.SINK_ENV: sink,
        vllm_live.IMPL_ENV: impl.name,
        vllm_live.CONFIG_ENV: json.dumps(config.to_dict()),
    }
    if on_cpu:
        env[vllm_live.CPU_ENV] = "1"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    if os.environ.get("VLLM_PLUGINS") is not None and "specreplay" not in os.environ["VLLM_PLUGINS"].split(","):
        env["VLLM_PLUGINS"] = os.environ["VLLM_PLUGINS"] + ",specreplay"
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    outcome: dict[str, Any] = {"status": "completed"}
    llm = None
    try:
        vllm_live.register()  # this process; vLLM loads the same entry point in the ones it starts
        try:
            weights = ({"model": tiny_model_dir(config), "load_format": "dummy", "dtype": "float32"} if model is None
                       else {"model": model, "dtype": "auto"})
            llm = vllm.LLM(
                **weights, skip_tokenizer_init=True,
                max_model_len=config.max_model_len, max_num_batched_tokens=config.max_num_batched_tokens,
                max_num_seqs=config.max_num_seqs, block_size=config.block_size,
                num_gpu_blocks_override=config.num_blocks, enable_prefix_caching=False,
                long_prefill_token_threshold=config.long_prefill_token_threshold, enforce_eager=True,
                async_scheduling=config.async_scheduling, seed=workload.seed,
                speculative_config=speculative_config(config), disable_log_stats=True)
        except (ValueError, TypeError) as exc:
            raise InputError(f"vllm rejects this engine config: {' '.join(str(exc).split())[:200]}") from None
        counts, outcome = _drive(llm, workload, sampling_params)
        outcome["engine_output_tokens"] = counts
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    rows = vllm_live.merge_parts(sink)
    vllm_live.clean_sink(sink)
    impl_doc = {"name": impl.name, "engine": "vllm", "executor": impl.executor,
                "scheduler": "AsyncScheduler" if config.async_scheduling else "Scheduler",
                "runner": "GPUModelRunner (live)", "models": f"vllm {vllm.__version__}",
                "model": model or "tiny dummy-weight llama (written on the fly)",
                "drafter": "ngram_gpu" if config.async_scheduling else "ngram",
                "patches": list(vllm_live.CPU_PATCHES) if on_cpu else []}
    return Trace(table=vllm_live.rows_to_table(rows), workload=workload.to_dict(), config=config.to_dict(),
                 impl=impl_doc, outcome=outcome, seed=workload.seed, device="cpu" if on_cpu else device,
                 volatile={"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "host": platform.node(), "python": platform.python_version()})


def cpu_attention_config(config):
    """vLLM's CPU attention takes block sizes in multiples of 32: round the block size up and
    scale the block count to keep the KV capacity (tokens) the workload asked for. The trace's
    config metadata holds what actually ran."""
    from dataclasses import replace

    if config.block_size % 32 == 0:
        return config
    block_size = -(-config.block_size // 32) * 32
    usable_tokens = (config.num_blocks - 1) * config.block_size
    return replace(config, block_size=block_size, num_blocks=1 + max(1, usable_tokens // block_size))


def _drive(llm: Any, workload: Workload, sampling_params: Any) -> tuple[dict[str, int], dict[str, Any]]:
    """Add requests at their arrival steps (one LLMEngine.step() per engine step), abort at their
    abort steps, and step until nothing is left. Returns each request's output token count as
    the engine itself reports it, and the run's outcome."""
    oracle = Oracle(workload)
    engine = llm.llm_engine
    arrivals: dict[int, list] = {}
    for spec in workload.requests:
        arrivals.setdefault(spec.arrival_step, []).append(spec)
    aborts: dict[int, list[str]] = {}
    for spec in workload.requests:
        if spec.abort_step:
            aborts.setdefault(spec.abort_step, []).append(spec.request_id)
    counts: dict[str, int] = {}
    step = 0
    while True:
        step += 1
        for spec in arrivals.pop(step, ()):
            params = sampling_params(spec.max_tokens, oracle.stop_token(spec.request_id))
            engine.add_request(spec.request_id, {"prompt_token_ids": oracle.prompt(spec.request_id)}, params)
        if aborts.get(step):
            engine.abort_request(aborts.pop(step))
        try:
            outputs = engine.step()
        except Exception as exc:  # the engine died: that is the run's outcome, not specreplay's crash
            return counts, {"status": "crashed", "step": step, "kind": "engine-crash",
                            "message": f"{type(exc).__name__}: {exc}"[:500]}
        for out in outputs:
            if out.finished:
                counts[out.request_id] = len(out.outputs[0].token_ids) if out.outputs else 0
        if not engine.has_unfinished_requests() and not arrivals:
            return counts, {"status": "completed"}
        if step >= workload.max_steps:
            return counts, {"status": "step_limit", "step": step}
