"""Recording your own vLLM: `SPECREPLAY_RECORD=DIR` in the environment of any vLLM 0.32 process.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. vLLM loads specreplay's `vllm.general_plugins` entry point
(families/vllm/plugin.py `register`) in every process it starts: the front end (`LLM`, `AsyncLLM`, `vllm
serve`'s API server), the engine core and its workers. With `SPECREPLAY_RECORD` set, each attaches
what it can see, unchanged (no variant, no lookahead, no patch but the CPU recipe's on a CPU
platform):

- the engine core's scheduler: the scheduler observer (both views' scheduler side, as on every
  engine) and the input observer (arrivals with prompt ids and sampling parameters, aborts,
  pauses, cache resets, streaming chunks, resubmissions), and the engine config, read from the
  real `VllmConfig`;
- every `GPUModelRunner`: the worker observer.

On a CPU the plugin applies the CPU recipe's patches, and MRV2's (families/vllm/mrv2/cpu_triton.py) when the
user asked vLLM for it (`VLLM_USE_V2_MODEL_RUNNER=1`): the runner is the one the user's vLLM
picks, never another. MRV2's need Triton's interpreter on from the process's start
(`TRITON_INTERPRET=1`, which `specreplay record --attach` sets): without it the process records a
`not_recorded` line saying so (`cpu_patches`), and the merge prints it; the user's engine is left
to vLLM, which refuses MRV2 without a Triton as it would without specreplay.

Each process writes its own part file under DIR (traces/parts.py), whose first line names the
run: the first process to load the plugin draws a run id and leaves it in the environment for
the processes it starts, so the parts of one run share it and two runs in one folder are told
apart. `specreplay merge DIR` (workflows/merge.py) joins the parts into one trace.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

RECORD_ENV = "SPECREPLAY_RECORD"
RUN_ENV = "SPECREPLAY_RUN_ID"


#: The OpenAI server's engine ids for a client's request id X: `cmpl-X-<prompt index>` for
#: completions (vllm/entrypoints/openai/completion/serving.py), `chatcmpl-X` for chat.
_SERVER_ID = re.compile(r"^(?:cmpl-(?P<completion>.+)-(?P<index>\d+)|chatcmpl-(?P<chat>.+))$")


@functools.lru_cache(maxsize=1 << 16)  # asked for every request at every step
def client_id(internal: str) -> str:
    """The client's own request id for an engine's: vLLM's random suffix stripped
    (plugin.external_id), then the OpenAI server's wrapping; a completion's later prompts of one
    request keep their index (`X#1`). Ids from `LLM` / `AsyncLLM` are the caller's already."""
    from specreplay.replay.families.vllm.plugin import external_id

    rid = external_id(internal)
    m = _SERVER_ID.match(rid)
    if m is None:
        return rid
    if m["chat"] is not None:
        return m["chat"]
    return m["completion"] if m["index"] == "0" else f"{m['completion']}#{m['index']}"


def recording_folder() -> str | None:
    return os.environ.get(RECORD_ENV) or None


def run_id() -> str:
    """This run's id: drawn by the first process that asks, inherited by the ones it starts."""
    if not os.environ.get(RUN_ENV):
        os.environ[RUN_ENV] = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"
    return os.environ[RUN_ENV]


def engine_config_of(vllm_config: Any, scheduler: Any = None) -> tuple[Any, dict[str, Any]]:
    """The engine config the run has, read from vLLM's own config (and the scheduler's KV cache:
    num_blocks is known only once the engine sized it); plus what the trace's impl says of it."""
    from specreplay.replay.families.vllm.setup import default_vllm_version
    from specreplay.replay.workloads.config import EngineConfig

    sched, cache, model = vllm_config.scheduler_config, vllm_config.cache_config, vllm_config.model_config
    spec = vllm_config.speculative_config
    num_blocks = cache.num_gpu_blocks
    if scheduler is not None:
        pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
        num_blocks = getattr(pool, "num_gpu_blocks", None) or num_blocks
    config = EngineConfig(
        max_num_batched_tokens=sched.max_num_batched_tokens,
        max_num_seqs=sched.max_num_seqs,
        num_spec_tokens=vllm_config.num_speculative_tokens,
        async_scheduling=bool(sched.async_scheduling),
        block_size=cache.block_size,
        num_blocks=int(num_blocks or 1),
        max_model_len=model.max_model_len,
        long_prefill_token_threshold=sched.long_prefill_token_threshold,
        vocab_size=model.get_vocab_size(),
        num_lookahead_tokens=vllm_config.num_lookahead_tokens,
        # The running vLLM's release, so a replay models it; an unmodelled one: the newest model.
        vllm_version=default_vllm_version(),
        enable_prefix_caching=bool(cache.enable_prefix_caching),
        eagle_block_drop=bool(spec is not None and spec.use_eagle_block_drop()),
        kv_connector=connector_of(vllm_config),
    )
    about = {
        "drafter": (spec.method if spec is not None else None) or "none",
        "model": str(model.model),
        "scheduler_cls": type(scheduler).__name__ if scheduler is not None else "?",
    }
    return config, about


def connector_of(vllm_config: Any) -> str:
    """The KV connector the engine runs with ('' for none): its class name as the user named it
    (`kv_transfer_config.kv_connector`), with the module it was loaded from where one was given."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    name = getattr(transfer, "kv_connector", None) or ""
    module = getattr(transfer, "kv_connector_module_path", None)
    return f"{module}:{name}" if name and module else name


def part_header(role: str, tokens: str | None = "plain") -> dict[str, Any]:
    """The first line of every part file: which run, which process, how its token ids are written
    (traces/pseudonym.py MODES; None: a part that records none)."""
    import vllm

    from specreplay.replay.families.vllm.plugin import applied_patches
    from specreplay.traces.schema import SCHEMA_VERSION

    return {
        "e": "part",
        "run": run_id(),
        "role": role,
        "pid": os.getpid(),
        "started": time.time(),
        "vllm": getattr(vllm, "__version__", "?"),
        "patches": applied_patches(),
        "tokens": tokens,
        # The trace schema its rows follow: merge stamps the trace with the oldest of a run's parts
        # (a part without one was written before schema v8), so a diff leaves out what it lacks.
        "schema": SCHEMA_VERSION,
    }


def recording_sink(folder: str, role: str, vocab: Callable[[], int]) -> tuple[Any, bool]:
    """This process's part, in the token mode the user asked for (SPECREPLAY_TOKENS,
    traces/pseudonym.py), and whether to record into it. A mode that cannot be honoured (a
    value it does not know, a key it cannot read) records nothing but a `not_recorded` line
    and one line on stderr: never the plain ids of a user who asked for pseudonyms, and never
    an exception in their engine."""
    from specreplay.replay.families.vllm import hang
    from specreplay.replay.families.vllm.flight import check_failed, flight_recorder_started
    from specreplay.replay.families.vllm.hang import HANG_ENV, hang_seconds
    from specreplay.replay.families.vllm.sink import Sink
    from specreplay.traces.errors import InputError
    from specreplay.traces.online_checks import DUMP_ON_ENV, online_checks
    from specreplay.traces.pseudonym import for_recording, token_mode
    from specreplay.traces.window import WINDOW_ENV, window_steps

    try:
        mode = token_mode()
        window, checks, stall = window_steps(), online_checks(), hang_seconds()
        if checks and window is None:
            raise InputError(f"{DUMP_ON_ENV} writes a flight recorder's window: set {WINDOW_ENV}=STEPS too")
        if stall is not None and window is None:
            raise InputError(f"{HANG_ENV} writes a flight recorder's window: set {WINDOW_ENV}=STEPS too")
        pseudonym = for_recording(folder, run_id(), vocab_of(vocab)) if mode == "pseudonym" else None
    except InputError as exc:
        return not_recording(folder, role, str(exc)), False
    transform = pseudonym.event if pseudonym is not None else None
    header = part_header(role, mode)
    sink = Sink(folder, role, header, transform=transform, window=window, checks=checks, on_check=check_failed)
    if window is not None:  # a flight recorder (families/vllm/flight.py): it dumps on a crash, SIGUSR1, a check
        flight_recorder_started(folder)
    if stall is not None and role != "core":  # a hang's dump (families/vllm/hang.py): every process answers
        hang.start(role, stall)  # (the core's watcher, which also watches, starts once its scheduler is attached)
    return sink, True


def cpu_patches(folder: str) -> None:
    """The CPU patches for the runner the user's vLLM picks (plugin.wants_mrv2: MRV2 only when
    they asked for it). One the process cannot apply (MRV2 without TRITON_INTERPRET=1 from its
    start) is one line in a part of its own and on stderr, never an exception in their engine:
    a plugin that raises stops vLLM where it loads it."""
    from specreplay.replay.families.vllm.plugin import apply_cpu_patches, wants_mrv2
    from specreplay.traces.errors import InputError

    try:
        apply_cpu_patches(mrv2=wants_mrv2())
    except InputError as exc:
        if str(exc) in _NOTED:  # vLLM may load its plugins more than once in a process
            return
        _NOTED.add(str(exc))
        not_recording(folder, "plugin", str(exc))


_NOTED: set[str] = set()


def not_recording(folder: str, role: str, message: str) -> Any:
    """What this process could not record, and why: a `not_recorded` line in a part of its own
    (the merge prints it) and one line on stderr."""
    import sys

    from specreplay.replay.families.vllm.sink import Sink

    sink = Sink(folder, role, part_header(role, tokens=None))
    sink.write({"e": "not_recorded", "message": message}, now=True)
    print(f"specreplay: not recording: {message}", file=sys.stderr)
    return sink


def vocab_of(read: Callable[[], int]) -> int:
    from specreplay.traces.errors import InputError

    try:
        return int(read())
    except Exception as exc:  # a runner of a fork that keeps its config elsewhere
        message = f"pseudonymised tokens: cannot read the model's vocabulary size ({exc}); nothing was recorded"
        raise InputError(message) from None


def attach_recorder_to_core(core: Any, folder: str) -> Any:
    """The scheduler and input observers on an engine core's scheduler, unchanged otherwise."""
    from specreplay.replay.families.vllm import hang
    from specreplay.replay.families.vllm.sink import sink_recorder
    from specreplay.replay.impls.registry import qualified_name
    from specreplay.replay.observers.input_observer import InputObserver, attach_inputs
    from specreplay.replay.observers.scheduler_observer import SchedulerObserver, attach

    scheduler = core.scheduler
    config, about = engine_config_of(scheduler.vllm_config, scheduler)
    sink, recording = recording_sink(folder, "core", lambda: config.vocab_size)
    if not recording:
        return sink
    # in_schedule: a schedule() under way, the step an exception in it ends the run at (flight.py)
    clock = {"step": 0, "in_schedule": False}
    core._specreplay_clock = clock
    sink.write({"e": "config", "config": config.to_dict(), **about})
    observer = SchedulerObserver(
        scheduler,
        sink_recorder(sink),
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        external_id=client_id,
    )
    scheduler._specreplay_observer = observer  # the engine core's refusals of new requests mark it (plugin.py)

    def next_step(_so: Any) -> int:
        clock["step"] += 1
        sink.write({"e": "step", "step": clock["step"], "t": time.time()})
        return clock["step"]

    inputs = InputObserver(scheduler, observer, sink.write, lambda: clock["step"], client_id)
    for rid in list(scheduler.requests):  # added before the recorder attached: arrived at step 1
        observer.request_added(rid)
        inputs.request_seen(scheduler.requests[rid], step=1)
    attach(observer, step_of=next_step, apply_step=lambda: clock["step"])
    attach_inputs(inputs)
    observed = scheduler.schedule

    @functools.wraps(observed)
    def schedule(*a: Any, **kw: Any) -> Any:
        clock["in_schedule"] = True
        so = observed(*a, **kw)  # an exception leaves it set: the run died in this step's schedule()
        clock["in_schedule"] = False
        return so

    scheduler.schedule = schedule
    sink.write({"e": "ran", "scheduler": qualified_name(type(scheduler))})
    stall = hang.hang_seconds()  # read (and checked) by recording_sink already
    if stall is not None:
        hang.start("core", stall, busy=lambda: requests_waiting_or_running(scheduler))
    return sink


def requests_waiting_or_running(scheduler: Any) -> int:
    """What the hang watchdog asks (from its own thread: two list lengths): 0 while the scheduler
    is paused, as no step is due then."""
    state = getattr(scheduler, "pause_state", None)
    if state is not None and getattr(state, "name", "UNPAUSED") != "UNPAUSED":
        return 0
    return int(scheduler.get_num_unfinished_requests())


def attach_recorder_to_runner(runner: Any, folder: str) -> Any:
    from specreplay.replay.families.vllm.plugin import _family_or_report
    from specreplay.replay.families.vllm.sink import SinkWriter
    from specreplay.replay.impls.registry import qualified_name

    sink, recording = recording_sink(folder, "runner", lambda: runner.model_config.get_vocab_size())
    if not recording:
        return sink
    family = _family_or_report(runner, sink)  # never a variant here: the user's own runner, as built
    if family is not None:
        family.attach(runner, SinkWriter(sink), client_id)
        sink.write({"e": "ran", "runner": qualified_name(type(runner)), "runner_family": family.name})
    return sink


__all__ = [
    "RECORD_ENV",
    "RUN_ENV",
    "attach_recorder_to_core",
    "cpu_patches",
    "attach_recorder_to_runner",
    "recording_folder",
]
