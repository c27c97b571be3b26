"""The seams between the driver loop and what it drives, written down as Protocols, and the wiring.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. `SchedulerPort` is what the loop calls on a scheduler (the reference
`Scheduler`, or `VllmSchedulerAdapter` in front of the real one: vLLM's `SchedulerInterface`,
reduced to what the loop uses); `RunnerPort` what it calls on a runner (the reference
`GPUModelRunner` and its variants). `wire` builds one run's parts and attaches the observers
(observers/) to the vLLM-shaped objects inside them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from specreplay.replay.engines.registry import DEFAULT_RUNNER, loop_engine, runner_family
from specreplay.replay.families.vllm.v1.observer import RecorderWriter
from specreplay.replay.impls.registry import Implementation
from specreplay.replay.models.messages import ModelRunnerOutput, SchedulerOutput
from specreplay.replay.models.request import Request
from specreplay.replay.observers.recorder import Recorder
from specreplay.replay.observers.scheduler_observer import SchedulerObserver, attach
from specreplay.replay.observers.truth import KvTruth
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import Workload


class SchedulerPort(Protocol):
    """What the engine loop calls on a scheduler, in vLLM's terms."""

    is_async: bool
    step: int  # the engine's step count before the next schedule() (idle gaps included)

    # Read, never assigned, by the loop (the real scheduler's adapter forwards them read-only).
    @property
    def requests(self) -> dict[str, Any]: ...  # live requests by id, each with vLLM's Request fields
    @property
    def running(self) -> list[Any]: ...

    def add_request(self, request: Request) -> Any: ...
    def schedule(self) -> SchedulerOutput: ...
    def update_from_output(self, out: SchedulerOutput, model_output: ModelRunnerOutput) -> Any: ...
    def update_draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> None: ...
    def has_requests(self) -> bool: ...
    def has_finished_requests(self) -> bool: ...  # finished since the last schedule(), not yet announced
    @property
    def pause_state(self) -> str: ...  # unpaused | paused_new | paused_all
    def finish_requests(self, request_ids: list[str]) -> list[str]: ...
    def set_pause_state(self, state: str) -> None: ...
    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool: ...


class RunnerPort(Protocol):
    """What the engine loop calls on a runner: vLLM's execute_model / sample_tokens split."""

    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput | None: ...
    def sample_tokens(self) -> ModelRunnerOutput: ...
    def take_draft_token_ids(self) -> tuple[list[str], list[list[int]]]: ...


class TraceSource(Protocol):
    """A run that records a trace: its header (metadata, no rows) first, rows as they settle."""

    recorder: Recorder

    def header(self) -> Any: ...


@dataclass
class EngineParts:
    """One run's objects: what the loop drives and who watches it."""

    impl: Implementation
    oracle: Oracle
    scheduler: SchedulerPort
    observed: Any  # the vLLM-shaped scheduler the observer watches (the real one behind an adapter)
    runner: RunnerPort
    recorder: Recorder
    scheduler_observer: SchedulerObserver


def wire(
    workload: Workload,
    impl: Implementation,
    device: str,
    engine: str,
    step_now: Callable[[], int],
    oracle: Oracle | None = None,
    runner: str = DEFAULT_RUNNER,
) -> EngineParts:
    """Build the scheduler and runner of `impl` on `engine` (its entry in engines/registry.py)
    and attach the observers. `step_now()`: the engine step being scheduled or applied (the
    loop's clock). `oracle`: the tokens the run produces (default: the workload's synthetic
    ones; a replay passes a recording's). `runner`: the runner family to build (registry
    `RUNNERS`). The run decided before that `impl` runs there (`Engine.refuse`)."""
    config = workload.config
    oracle = oracle or Oracle(workload)
    family = runner_family(runner)
    family.refuse(impl)  # before anything is built
    scheduler, observed = loop_engine(engine).build_scheduler(impl, config)
    family.serve(observed)
    built = family.build(impl, config, oracle, device)
    recorder = Recorder()
    observer = SchedulerObserver(
        observed,
        recorder,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        order={spec.request_id: i for i, spec in enumerate(workload.requests)},
        mismatches=oracle.mismatches,
    )
    attach(observer, step_of=lambda so: step_now(), apply_step=step_now)
    writer = RecorderWriter(recorder)
    family.observe_reference_runner(built, writer, KvTruth(oracle, writer, config.block_size))
    return EngineParts(impl, oracle, scheduler, observed, built, recorder, observer)
