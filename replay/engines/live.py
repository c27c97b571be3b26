"""`--engine vllm`: drive a tiny live vLLM engine through a workload and return its recorded trace.

Where it sits: workloads -> models -> impls -> record -> **engines** -> check. Builds `vllm.LLM`
from the workload's engine config (dummy weights, a tiny model config written on the fly, no
tokenizer, no hub) and steps it: a live engine drives its own scheduler and runner, so what
this module drives is its input side, with the same input driver as the other engines
(arrivals at their steps, aborts). The plugin (engines/plugin.py) attaches the same observers
as the other engines inside vLLM's processes; their part files are merged into one trace.
`--executor inproc` keeps the engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0);
`multiproc` runs it, and on a CPU the worker too, in processes of their own.

On a CPU machine the recipe's two patches are applied inside specreplay's run only (no pinned
memory; keep async scheduling on), and stamped into the trace metadata.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from specreplay.replay.engines import plugin
from specreplay.replay.engines import sink as sink_files
from specreplay.replay.engines.inputs import InputDriver
from specreplay.replay.impls.registry import Implementation
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError, ObserverError
from specreplay.traces.trace import Trace


def run_live(
    workload: Workload,
    impl: Implementation,
    device: str = "cpu",
    model: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Trace:
    """`model`: a model folder or hub name with real weights; None: the tiny dummy-weight model."""
    from specreplay.replay.engines.run import trace_header
    from specreplay.replay.engines.vllm_setup import load_vllm

    impl.require_real_forms("vllm")
    if workload.events:
        raise InputError(
            f"--engine vllm does not drive control events yet ({len(workload.events)} in this workload); "
            "use --engine vllm-scheduler, which calls the real scheduler's pause, reset and abort methods"
        )
    vllm = load_vllm()
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    config = cpu_attention_config(workload.config) if on_cpu else workload.config
    sink = sink_files.new_sink()
    env = live_environment(impl, config, sink, on_cpu)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    outcome: dict[str, Any] = {"status": "completed"}
    llm = None
    try:
        plugin.register()  # this process; vLLM loads the same entry point in the ones it starts
        llm = build_llm(vllm, config, model, workload.seed)
        counts, outcome = drive(llm, workload, progress)
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
    parts = sink_files.read_parts(sink)
    sink_files.clean_sink(sink)
    failures = sink_files.observer_failures(parts)
    if failures:  # specreplay's own failure, not the engine's crash (record/guard.py)
        raise ObserverError(failures[0])
    rows = sink_files.merge_rows(parts)
    impl_doc = {
        "name": impl.name,
        "engine": "vllm",
        "executor": impl.executor,
        "scheduler": "AsyncScheduler" if config.async_scheduling else "Scheduler",
        "runner": "GPUModelRunner (live)",
        "models": f"vllm {vllm.__version__}",
        "model": model or "tiny dummy-weight llama (written on the fly)",
        "drafter": "ngram_gpu" if config.async_scheduling else "ngram",
        "patches": list(plugin.CPU_PATCHES) if on_cpu else [],
    }
    header = trace_header(workload, impl_doc, "cpu" if on_cpu else device, outcome, config)
    return replace(header, table=sink_files.rows_to_table(rows))


def live_environment(impl: Implementation, config: EngineConfig, sink: str, on_cpu: bool) -> dict[str, str]:
    """The environment of a live run: where the plugin writes, which implementation and config
    it attaches, in-process or multiprocess engine core, and the CPU recipe's settings."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if impl.executor == "multiproc" else "0",
        plugin.SINK_ENV: sink,
        plugin.IMPL_ENV: impl.name,
        plugin.CONFIG_ENV: json.dumps(config.to_dict()),
    }
    if on_cpu:
        env[plugin.CPU_ENV] = "1"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    if os.environ.get("VLLM_PLUGINS") is not None and "specreplay" not in os.environ["VLLM_PLUGINS"].split(","):
        env["VLLM_PLUGINS"] = os.environ["VLLM_PLUGINS"] + ",specreplay"
    return env


def build_llm(vllm: Any, config: EngineConfig, model: str | None, seed: int) -> Any:
    """`vllm.LLM` on the workload's engine config: the tiny dummy-weight model unless `model`."""
    from specreplay.replay.engines.vllm_setup import speculative_config, tiny_model_dir

    weights = (
        {"model": tiny_model_dir(config), "load_format": "dummy", "dtype": "float32"}
        if model is None
        else {"model": model, "dtype": "auto"}
    )
    try:
        return vllm.LLM(
            **weights,
            skip_tokenizer_init=True,
            max_model_len=config.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            block_size=config.block_size,
            num_gpu_blocks_override=config.num_blocks,
            enable_prefix_caching=False,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            enforce_eager=True,
            async_scheduling=config.async_scheduling,
            seed=seed,
            speculative_config=speculative_config(config),
            disable_log_stats=True,
        )
    except (ValueError, TypeError) as exc:
        raise InputError(f"vllm rejects this engine config: {' '.join(str(exc).split())[:200]}") from None


def cpu_attention_config(config: EngineConfig) -> EngineConfig:
    """vLLM's CPU attention takes block sizes in multiples of 32: round the block size up and
    scale the block count to keep the KV capacity (tokens) the workload asked for. The trace's
    config metadata holds what actually ran."""
    if config.block_size % 32 == 0:
        return config
    block_size = -(-config.block_size // 32) * 32
    usable_tokens = (config.num_blocks - 1) * config.block_size
    return replace(config, block_size=block_size, num_blocks=1 + max(1, usable_tokens // block_size))


def drive(
    llm: Any, workload: Workload, progress: Callable[[int, int], None] | None = None
) -> tuple[dict[str, int], dict[str, Any]]:
    """Feed the engine its inputs (one LLMEngine.step() per engine step) and step until nothing
    is left. Returns each request's output token count as the engine itself reports it, and the
    run's outcome."""
    from specreplay.replay.engines.vllm_setup import sampling_params

    inputs = InputDriver(workload, Oracle(workload))
    engine = llm.llm_engine
    counts: dict[str, int] = {}
    step = 0
    while True:
        step += 1
        for spec in inputs.pop_arrivals(step):
            prompt, max_tokens, stop = inputs.submit(spec)
            engine.add_request(spec.request_id, {"prompt_token_ids": prompt}, sampling_params(max_tokens, stop))
        aborts = inputs.pop_aborts(step)
        if aborts:
            engine.abort_request(aborts)
        try:
            outputs = engine.step()
        except Exception as exc:  # the engine died: that is the run's outcome, not specreplay's crash
            return counts, {
                "status": "crashed",
                "step": step,
                "kind": "engine-crash",
                "message": f"{type(exc).__name__}: {exc}"[:500],
            }
        for out in outputs:
            if out.finished:
                counts[out.request_id] = len(out.outputs[0].token_ids) if out.outputs else 0
        if progress is not None:
            progress(step, workload.max_steps)
        if not engine.has_unfinished_requests() and inputs.next_input_step(step) is None:
            return counts, {"status": "completed"}
        if step >= workload.max_steps:
            return counts, {"status": "step_limit", "step": step}
