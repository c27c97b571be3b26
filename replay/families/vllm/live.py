"""`--engine vllm`: drive a tiny live vLLM engine through a workload and return its recorded trace.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. Builds `vllm.LLM` from the workload's engine config (dummy weights, a
tiny model config written on the fly, no tokenizer, no hub) and steps it: a live engine drives its
own scheduler and runner, so what this module drives is its input side, with the same input driver
as the other engines (arrivals at their steps, aborts, control events), through the engine's own API
(`LiveInputs`). The plugin (families/vllm/plugin.py) attaches the same observers as the other engines
inside vLLM's processes, and they see the inputs from the scheduler's own calls; their part files
are merged into one trace. `--executor inproc` keeps the engine core in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), one engine iteration per LLMEngine.step(), so inputs land at the
workload's steps; `multiproc` runs it, and on a CPU the worker too, in processes of their own, where
the engine core steps on its own and inputs land when it takes them.

On a CPU machine the recipe's two patches are applied inside specreplay's run only (no pinned
memory; keep async scheduling on), and stamped into the trace metadata. A run of the tiny model is
forced by default (families/vllm/forced_logits.py): the engine samples the workload oracle's tokens for
what it fed and drafts the workload's drafts with the draft model, so the trace has token ground
truth (T1); the patches are stamped too.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from inspect import signature
from typing import Any

from specreplay.replay.engines.events import Pause, apply_control, control_event
from specreplay.replay.engines.inputs import InputDriver
from specreplay.replay.engines.outcome import run_outcome
from specreplay.replay.engines.registry import DEFAULT_LIVE_RUNNER, RunnerFamily, engine, runner_family
from specreplay.replay.families.vllm import drafters, forced_logits, plugin
from specreplay.replay.families.vllm import sink as sink_files
from specreplay.replay.families.vllm.mrv2 import cpu_triton
from specreplay.replay.families.vllm.setup import serves_mrv2_only
from specreplay.replay.impls.registry import Implementation
from specreplay.replay.models.releases import release_of
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError, ObserverError
from specreplay.traces.header import Inputs, Outcome
from specreplay.traces.journal import JournalWriter
from specreplay.traces.parts import (
    collect_inputs,
    merge_rows,
    observer_failures,
    ran_classes,
    read_parts,
    whole_steps,
)
from specreplay.traces.trace import Trace


def run_live(
    workload: Workload,
    impl: Implementation,
    device: str = "cpu",
    model: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    runner: str | None = None,
    drafter: str | None = None,
    forced: bool | None = None,
    journal: str | os.PathLike[str] | None = None,
) -> Trace:
    """`model`: a model folder or hub name with real weights; None: the tiny dummy-weight model.
    `runner`: the runner family vLLM builds (engines/registry.py; default: what vLLM itself picks
    where Triton counts as present, Model Runner V2). `drafter`: families/vllm/drafters.py's (default:
    a forced run's draft_model, else ngram_gpu async, ngram sync). `forced`: the engine samples
    the oracle's tokens (families/vllm/forced_logits.py); default: with the tiny dummy-weight model
    (real weights sample their own) unless SPECREPLAY_LIVE_UNFORCED=1. `journal`: where the
    whole steps the observers' part files hold go when the run ends by an exception (specreplay's
    own failure, Ctrl-C), for `specreplay recover`, as the other engines keep theirs."""
    from specreplay.replay.families.vllm.setup import refuse_engine_without_kernels, require_version

    family = runner_family(runner or DEFAULT_LIVE_RUNNER)
    if forced is None:
        forced = model is None and os.environ.get(forced_logits.UNFORCED_ENV) != "1"
    drafter = drafters.drafter_for(workload.config, drafter, forced)
    in_process = impl.executor != "multiproc"
    refuse_undrivable(workload, in_process)
    if impl.real_runner is not None and impl.real_runner_family != family.name:
        raise InputError(
            f"{impl.name}'s real runner form subclasses the {impl.real_runner_family} runner: "
            f"pass --runner {impl.real_runner_family}"
        )
    mrv2_on_cpu = family.name == "v2" and not _has_cuda()
    if not cpu_triton.compatible(mrv2_on_cpu):
        # This process imported vLLM with Triton decided the other way (vLLM decides once, at
        # import): the run goes to a fresh process of its own.
        return run_live_in_child(workload, impl, device, model, family.name, drafter, forced, journal)
    if mrv2_on_cpu:
        cpu_triton.apply()  # before vLLM is imported: it decides once whether Triton is present
    vllm = require_version(workload.config, "--engine vllm")
    refuse_engine_without_kernels()
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    config = drafters.live_config(cpu_attention_config(workload.config) if on_cpu else workload.config, drafter)
    sink = sink_files.new_sink()
    forced_dir = tempfile.mkdtemp(prefix="specreplay-forced-") if forced else None
    env = live_environment(impl, config, sink, on_cpu, family)
    if forced_dir is not None:
        env[forced_logits.FORCED_ENV] = forced_logits.write_workload(workload, forced_dir)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    outcome = run_outcome(0)
    llm = None
    try:
        plugin.register()  # this process; vLLM loads the same entry point in the ones it starts
        # vLLM's engine start collects the whole heap several times (load_model, its memory
        # profiling) before it freezes it; frozen first, those passes skip the interpreter's
        # long-lived objects (torch, vLLM, Triton): about 2 s of each engine start here. It
        # changes when Python frees memory, never what the engine computes; vLLM's shutdown
        # unfreezes.
        gc.freeze()
        llm = build_llm(vllm, config, model, workload.seed, drafter, forced)
        counts, outcome = drive(llm, workload, progress, in_process)
        outcome = replace(outcome, engine_output_tokens=counts)
    except BaseException:
        if journal is not None and llm is not None:
            parts = read_parts(sink)
            header = live_header(parts, workload, impl, device, model, drafter, forced, family, config, on_cpu, outcome)
            rows, _ = whole_steps(merge_rows(parts))
            writer = JournalWriter(journal, header)
            writer.append(sink_files.rows_to_table(rows))
            writer.close()
        raise
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
        if forced_dir is not None:
            shutil.rmtree(forced_dir, ignore_errors=True)
    parts = read_parts(sink)
    sink_files.clean_sink(sink)
    failures = observer_failures(parts)
    if failures:  # specreplay's own failure, not the engine's crash (observers/guard.py)
        raise ObserverError(failures[0])
    rows = merge_rows(parts)
    header = live_header(parts, workload, impl, device, model, drafter, forced, family, config, on_cpu, outcome)
    return replace(header, table=sink_files.rows_to_table(rows))


def live_header(
    parts: list[Any],
    workload: Workload,
    impl: Implementation,
    device: str,
    model: str | None,
    drafter: str,
    forced: bool,
    family: RunnerFamily,
    config: EngineConfig,
    on_cpu: bool,
    outcome: Outcome,
) -> Trace:
    """A live run's trace metadata from its part files: what the engine's processes ran, as their
    plugin saw it, and the inputs as the engine core took them (under multiproc their steps are
    the observed ones)."""
    from specreplay.replay.engines.run import trace_header

    inputs = collect_inputs(parts)
    ran = ran_classes(parts)
    impl_doc = engine("vllm").describe(
        impl,
        # What the engine's processes ran, as their plugin saw it (variant classes included).
        ran.get("scheduler", "AsyncScheduler" if config.async_scheduling else "Scheduler"),
        ran.get("runner", "GPUModelRunner (live)"),
        config,
        model=model or "tiny dummy-weight llama (written on the fly)",
        drafter=drafter,
        patches=(plugin.cpu_patches(family.name == "v2") if on_cpu else []) + forced_patches(parts, forced, drafter),
        runner_family=ran.get("runner_family", family.name),
    )
    header = trace_header(workload, impl_doc, "cpu" if on_cpu else device, outcome, config)
    return replace(header, inputs=Inputs.from_dict(inputs) if inputs else None)


def forced_patches(parts: list[Any], forced: bool, drafter: str) -> list[str]:
    """The forced-logits patches the runner's process reported (its `forced` line), and a draft
    model's budget (vllm_setup.drafting_slot_outside_budget); none when the run was not forced."""
    from specreplay.replay.families.vllm.setup import DRAFT_BUDGET_PATCH

    reported = [
        str(p) for part in parts for event in part.events if event.get("e") == "forced" for p in event["patches"]
    ]
    return reported + ([DRAFT_BUDGET_PATCH] if forced and drafter == "draft_model" and reported else [])


def live_environment(
    impl: Implementation, config: EngineConfig, sink: str, on_cpu: bool, family: RunnerFamily
) -> dict[str, str]:
    """The environment of a live run: where the plugin writes, which implementation and config
    it attaches, in-process or multiprocess engine core, the runner vLLM builds, and the CPU
    recipe's settings (with MRV2, Triton's interpreter in every process vLLM starts)."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if impl.executor == "multiproc" else "0",
        plugin.SINK_ENV: sink,
        plugin.IMPL_ENV: impl.name,
        plugin.CONFIG_ENV: json.dumps(config.to_dict()),
        plugin.RUNNER_ENV: family.name,
    }
    if not serves_mrv2_only():  # 0.34.0 on builds MRV2 unasked, and refuses being told V1
        env["VLLM_USE_V2_MODEL_RUNNER"] = family.env
    if on_cpu:
        env[plugin.CPU_ENV] = "1"
        if family.name == "v2":
            env["TRITON_INTERPRET"] = "1"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    if os.environ.get("VLLM_PLUGINS") is not None and "specreplay" not in os.environ["VLLM_PLUGINS"].split(","):
        env["VLLM_PLUGINS"] = os.environ["VLLM_PLUGINS"] + ",specreplay"
    return env


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_live_in_child(
    workload: Workload,
    impl: Implementation,
    device: str,
    model: str | None,
    runner: str,
    drafter: str,
    forced: bool | None = None,
    journal: str | os.PathLike[str] | None = None,
) -> Trace:
    """`run_live` in a fresh process (spawned: nothing of this one's vLLM or Triton carried
    over); its exceptions (a one-line InputError, an observer's failure) come back as raised."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_live, workload, impl, device, model, None, runner, drafter, forced, journal).result()


def build_llm(
    vllm: Any, config: EngineConfig, model: str | None, seed: int, drafter: str | None = None, forced: bool = False
) -> Any:
    """`vllm.LLM` on the workload's engine config: the tiny dummy-weight model unless `model`."""
    from specreplay.replay.families.vllm.setup import engine_args

    try:
        return vllm.LLM(**engine_args(config, model=model, seed=seed, drafter=drafter, forced=forced))
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


def refuse_undrivable(workload: Workload, in_process: bool) -> None:
    """The one event kind a live engine cannot take through its API: a pause in `wait` mode with
    the engine core in this process (vLLM 0.32's EngineCore.pause_scheduler refuses it)."""
    for event in map(control_event, workload.events):
        if in_process and isinstance(event, Pause) and event.mode == "wait":
            raise InputError(
                f"the pause (mode wait) at step {event.step} cannot be driven on --engine vllm --executor inproc: "
                "vLLM 0.32's in-process engine core refuses it (\"'wait' mode can't be used in inproc-engine mode\"); "
                "use --executor multiproc or --engine vllm-scheduler"
            )


def drive(
    llm: Any, workload: Workload, progress: Callable[[int, int], None] | None = None, in_process: bool = True
) -> tuple[dict[str, int], Outcome]:
    """Feed the engine its inputs (one LLMEngine.step() per engine step) and step until nothing
    is left. Returns each request's output token count as the engine itself reports it (summed
    over its lives and a session's turns), and the run's outcome."""
    feed = LiveInputs(llm.llm_engine, workload, in_process)
    step = 0
    while True:
        step += 1
        try:  # the engine died (an assert in add_request or in a step): the run's outcome, not specreplay's crash
            feed.before_step(step)
            if feed.expects_output():
                feed.took(feed.engine.step())
        except Exception as exc:
            return feed.counts, run_outcome(step, crash={"kind": crash_kind(exc), "message": crash_message(exc)})
        feed.notice_ends(step)
        if progress is not None:
            progress(step, workload.max_steps)
        if feed.done(step):
            # Idle for good while the front end still waits for some: requests the engine lost.
            return feed.counts, run_outcome(step, unfinished=feed.unfinished())
        if step >= workload.max_steps:
            return feed.counts, run_outcome(step, cut=True)


def crash_kind(exc: Exception) -> str:
    """`scheduler-assert` for an assert inside vLLM's scheduler (as the other engines name it, so
    a replay of the recording that dies on the same assert has the same outcome), else
    `engine-crash`."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    in_scheduler = bool(frames) and f"{os.sep}core{os.sep}sched{os.sep}" in frames[-1].filename
    return "scheduler-assert" if isinstance(exc, AssertionError) and in_scheduler else "engine-crash"


def crash_message(exc: Exception) -> str:
    """The engine's exception in one line; a bare vLLM assert names its source line, as the
    real-scheduler engine reports it (vllm_setup.asserting)."""
    what = str(exc)
    if isinstance(exc, AssertionError) and not what:
        import traceback

        frame = traceback.extract_tb(exc.__traceback__)[-1]
        what = f"{(frame.line or 'assert').strip()} ({os.path.basename(frame.filename)}:{frame.lineno})"
    return f"{type(exc).__name__}: {what}"[:500]


class LiveInputs:
    """The workload's inputs and control events, fed to a live engine through its own API at the
    steps the workload says, in the order the other engines apply them (engines/loop.py, after
    vLLM's EngineCoreProc): before step s's LLMEngine.step(), the idle callback (a pause's
    pending cache clear), arrivals, events; aborts after s's schedule() through the engine
    core's early-aborts queue. The observers in the engine core see each input from the
    scheduler call it ends in; nothing is marked from here.

    In this process the engine core is `llm_engine.engine_core.engine_core` (vLLM's InprocClient),
    stepped by LLMEngine.step() one iteration at a time: this driver is then the engine core's
    busy loop, and does what EngineCoreProc does around the step (its pause's idle callback, its
    input queue). With `multiproc` the engine core runs its own busy loop and this driver is its
    client: utility calls and aborts over the engine's sockets, landing when the core takes them.
    """

    def __init__(self, engine: Any, workload: Workload, in_process: bool) -> None:
        self.engine = engine
        self.inputs = InputDriver(workload, Oracle(workload))
        self.in_process = in_process
        self.client = engine.engine_core  # InprocClient or SyncMPClient
        self.core = self.client.engine_core if in_process else None  # vLLM's EngineCore, in this process
        self.clear_when_idle = False  # in process: a pause's clear_cache, run once the engine idles
        self.paused = False  # multiproc: between a pause (which returns once the core drained) and its resume
        self.quiet = False  # multiproc: the core sent nothing for a while; it is idle until the next input
        # A user's pause in abort or wait mode refuses new requests from vLLM 0.33.0 on
        # (EngineCoreProc.pause_generation, _reject_add_while_paused). Multiproc: the driver pauses
        # as a user does; in process EngineCore has no such pause, so the driver refuses them as
        # EngineCoreProc would, and marks it where the plugin marks a refusal.
        self.rejects_while_paused = release_of(workload.config.vllm_version).paused_rejects_new
        self.rejecting = False
        self.counts: dict[str, int] = {}

    # ------------------------------------------------------------------ the step
    def before_step(self, step: int) -> None:
        """EngineCoreProc's _process_input_queue before step `step`'s iteration."""
        self.finish_pause_if_idle()
        self.take_leftover_aborts()
        for spec in self.inputs.pop_arrivals(step):
            self.submit_spec(spec)
        for event in self.inputs.pop_events(step):
            self.finish_pause_if_idle()
            apply_control(event, self)
        aborts = self.inputs.pop_aborts(step)
        if aborts:
            self.abort_in_flight(aborts)

    def took(self, outputs: list[Any]) -> None:
        """Each request's output tokens (DELTA outputs: only the new ones), summed per id."""
        for out in outputs:
            for completion in out.outputs or ():
                self.counts[out.request_id] = self.counts.get(out.request_id, 0) + len(completion.token_ids)

    def notice_ends(self, step: int) -> None:
        """Tell the input driver what ended by step `step` (a conversation's next turn follows
        it: InputDriver.notice_ends): a request its front end no longer tracks, as the client
        that has its last output (or aborted it) sees it."""
        if self.inputs.after:
            states = self.engine.output_processor.request_states
            self.inputs.notice_ends(step, lambda rid: rid not in states)

    def expects_output(self) -> bool:
        """In process: always step (an idle iteration is a step). Multiproc: LLMEngine.step()
        blocks until the engine core sends outputs, so only when it has something to send."""
        if self.in_process:
            return True
        if self.paused or self.quiet or not self.engine.has_unfinished_requests():
            return False
        deadline = time.monotonic() + MULTIPROC_QUIET_S
        while self.client.outputs_queue.empty():  # SyncMPClient's queue, filled by its socket thread
            if time.monotonic() > deadline:
                self.quiet = True  # sessions between turns, a paused or lost request: nothing to step
                return False
            time.sleep(0.002)
        return True

    def done(self, step: int) -> bool:
        """Nothing left to feed, and nothing left to run. In process, as EngineCoreProc's busy
        loop decides (has_work, core.py:1534): the engine core is idle, with nothing
        unfinished, no finished request left to announce and no batch in flight, whether or not
        the front end still waits (it does not once the last output is out, but the core still
        schedules once to announce that request, popping the batch in flight: stopping there
        would make the run's last step depend on whether an input, even a no-op abort, is still
        due). Multiproc: the front end waits for nothing (the core drains on its own), or the
        core went quiet."""
        # next_input_step(step - 1): every input still to come (those of step + 1 included).
        if self.inputs.next_input_step(step - 1) is not None or self.clear_when_idle:
            return False
        if self.in_process:
            return self.core_idle()
        return not self.engine.has_unfinished_requests() or (self.quiet and not self.paused)

    def unfinished(self) -> list[str]:
        """Requests the front end still waits for (the engine went idle for good without them)."""
        from specreplay.replay.families.vllm.plugin import external_id

        return sorted({external_id(rid) for rid in self.engine.output_processor.request_states})

    def core_idle(self) -> bool:
        """EngineCoreProc.has_work(), negated (core.py:1534), without calling has_requests(): the
        observer counts those calls as the engine's iterations (families/vllm/plugin.py)."""
        sched = self.core.scheduler
        return not (sched.has_unfinished_requests() or sched.has_finished_requests() or self.core.batch_queue)

    # ------------------------------------------------------------------ requests
    def submit_spec(self, spec: Any) -> None:
        if self.rejecting and self.in_process and spec.request_id not in self.core.scheduler.requests:
            # The client's retryable engine_paused error: the scheduler never sees the request (a
            # streaming session's next chunk, an id the scheduler holds, is not new work).
            observer = getattr(self.core.scheduler, "_specreplay_observer", None)
            if observer is not None:
                observer.mark_refused(spec.request_id)
            self.inputs.refused(spec)
            return
        prompt, max_tokens, stop = self.inputs.submit(spec)
        self.submit(spec.request_id, prompt, max_tokens, stop, resumable=spec.streaming)
        if self.inputs.ends_at_once(spec):
            self.end_stream(spec.request_id)

    def submit(self, rid: str, prompt: list[int], max_tokens: int, stop: int | None, resumable: bool = False) -> None:
        """LLMEngine.add_request (llm_engine.py:229) as it runs with vLLM's
        VLLM_DISABLE_REQUEST_ID_RANDOMIZATION: the request keeps the workload's id, so a
        resubmission reaches the scheduler under the same id and a streaming session's chunks
        reach its session, as on the other engines (vLLM's envs cache makes the variable itself
        unreliable inside one process). `resumable`: a streaming-input chunk, as AsyncLLM builds
        it (async_llm.py:636)."""
        from vllm.sampling_params import RequestOutputKind

        from specreplay.replay.families.vllm.setup import sampling_params

        engine = self.engine
        params = sampling_params(max_tokens, stop)
        params.output_kind = RequestOutputKind.DELTA  # each output: the new tokens only (counts over lives)
        request = engine.input_processor.process_inputs(
            rid,
            {"prompt_token_ids": prompt},
            params,
            supported_tasks=engine.get_supported_tasks(),
            resumable=resumable,
        )
        request.external_req_id = rid
        engine.output_processor.add_request(request, None, None, 0)
        # The engine core's request gets its own prompt list: in one process nothing serialises
        # it, and a streaming session's next turn extends both the front end's list
        # (output_processor.py:217) and the scheduler's (scheduler.py _update_request_as_session),
        # which must not be one list (its chunk would be appended twice).
        if request.prompt_token_ids is not None:
            request.prompt_token_ids = list(request.prompt_token_ids)
        engine.engine_core.add_request(request)
        self.quiet = False

    def end_stream(self, rid: str) -> None:
        """AsyncLLM's final request of a session: a non-resumable one-token prompt, same id."""
        self.submit(rid, [0], 1, None)

    # ------------------------------------------------------------------ aborts
    def abort_in_flight(self, rids: list[str]) -> None:
        """Aborts after this step's schedule(), before the oldest batch is applied. In process:
        LLMEngine.abort_request's front-end half, and the engine core's early-aborts queue
        (core.py:247), which step_with_batch_queue drains right before update_from_output
        (core.py:782), as EngineCoreProc's input thread fills it (core.py:1928). Multiproc:
        LLMEngine.abort_request, which lands when the core takes it."""
        if not self.in_process:
            self.engine.abort_request(rids)
            self.quiet = False
            return
        ids = self.engine.output_processor.abort_requests(rids, internal=False)
        if ids:
            self.core.aborts_queue.put_nowait(ids)

    def take_leftover_aborts(self) -> None:
        """Early aborts the last iteration did not take (it applied no batch): they land from the
        input queue before the next schedule() (EngineCore.abort_requests, core.py:554)."""
        if not self.in_process:
            return
        ids: list[str] = []
        while not self.core.aborts_queue.empty():
            ids.extend(self.core.aborts_queue.get_nowait())
        if ids:
            self.core.abort_requests(ids)

    # ------------------------------------------------------------------ control events
    # LiveInputs' ControlTarget (engines/events.py), through the engine's API (the README's
    # "Control events"): apply_control calls these, one per kind.
    def abort(self, request_ids: list[str]) -> None:
        self.engine.abort_request(request_ids)  # llm_engine.py:224
        self.quiet = False

    def resubmit(self, request: str) -> None:
        self.submit_spec(self.inputs.spec_of[request])

    def stream_append(self, request: str) -> None:
        if self.inputs.lives.get(request) is None:
            return  # the session has not started
        if request not in self.engine.output_processor.request_states:
            self.inputs.drop_chunk(request)  # the session ended (aborted): its client stops streaming
            return
        tokens, max_tokens, last = self.inputs.next_chunk(request)
        self.submit(request, tokens, max_tokens, None, resumable=True)
        if last:
            self.end_stream(request)

    def pause(self, mode: str, clear_cache: bool, label: str = "") -> None:
        """Multiproc: EngineCoreProc.pause_scheduler (core.py:2061) as a utility call, which
        returns once the pause completed (the batches in flight drained, the cache cleared). In
        process, EngineCore.pause_scheduler (core.py:921) would clear the cache at once with a
        batch in flight: its clear is left to the idle callback, as EngineCoreProc does it, and
        pause(abort) first aborts through LLMEngine, whose front end no abort output reaches.
        (`label`: the observers in the engine core name it from the scheduler's call.)"""
        self.rejecting = self.rejects_while_paused and mode != "keep"
        if not self.in_process:
            self.client.call_utility(
                "pause_generation" if self.rejects_while_paused else "pause_scheduler", mode, clear_cache
            )
            self.paused = True
            return
        if mode == "abort":
            self.engine.abort_request(list(self.engine.output_processor.request_states), internal=True)
        self.core.pause_scheduler(mode=mode, clear_cache=False)
        self.clear_when_idle = clear_cache
        self.finish_pause_if_idle()

    def resume(self) -> None:
        self.rejecting = False
        if self.in_process:
            self.core.resume_scheduler()  # core.py:951
        else:
            self.client.call_utility("resume_scheduler")
            self.paused = self.quiet = False
        # A clear still pending stays registered, as vLLM's idle callback does.

    def reset_prefix_cache(self, reset_running: bool, label: str = "") -> None:
        try:
            self.engine.reset_prefix_cache(reset_running_requests=reset_running)  # llm_engine.py:403
        except Exception:
            # "Failed to reset KV cache even when all the running requests are preempted": a
            # session between turns holds blocks. vLLM raises to the caller after the
            # preemptions; the engine goes on (the observer marks it failed).
            pass
        self.quiet = False

    def finish_pause_if_idle(self) -> None:
        """EngineCoreProc's idle callback for a pause with clear_cache (core.py:2080): once the
        engine has no work, _finish_pause(clear_cache=True) resets the caches, preempting every
        request (vLLM returns a failed reset to the pause's caller; the engine goes on)."""
        if self.clear_when_idle and self.core_idle():
            self.clear_when_idle = False
            # 0.34.0 added whether the reset also clears the KV connector's cache; its
            # pause_scheduler's default (True) is what the pause asked for.
            more = (
                {"reset_connector": True} if "reset_connector" in signature(self.core._finish_pause).parameters else {}
            )
            try:
                self.core._finish_pause(True, **more)
            except RuntimeError:
                pass


#: Multiproc: how long the driver waits for the engine core's next output before it takes the
#: core for idle (sessions between turns, a request it lost). Long: a step of the tiny model
#: takes milliseconds, but the first ones compile vLLM's sampler helpers (15-30 s on 2 busy
#: cores), and a run taken for idle too early ends with its requests unfinished.
MULTIPROC_QUIET_S = 60.0
