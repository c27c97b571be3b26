"""Implementations under test: a registry of scheduler + runner + executor combinations.

Where it sits: workloads -> models -> **impls** -> observers -> engines -> traces -> check ->
workflows -> views -> cli. `record`, `replay` and `gate` resolve `--impl NAME` here; every engine
takes a variant from here, in the form that engine runs (the reference form on the reference models,
the real form on vLLM's classes), never by its name. A name from a trace resolves only through this
registry; `module:attr` (loaded only when the user passes it on the command line) may name an
`Implementation`, a `Scheduler` subclass or a `GPUModelRunner` subclass, or (on
`--engine sglang-scheduler`) a subclass of SGLang's Scheduler or of its batch result processor
(families/sglang/forms.py).

Built-ins:
  upstream      vLLM 0.32.0 behaviour
  pr30796       the worker drops the draft slots of a request re-entering the batch, editing the
                SchedulerOutput in place (which the in-process executor shares with the scheduler)
  pr30796-copy  the same edit on the worker's private copy (multiprocess executor)
  sched-clear   the scheduler clears the all -1 draft placeholders of running requests it did not
                schedule (the fix proposed in PRs #37629 / #46899)
  noclamp       the runner of vLLM <= 0.22: no clamp, a -1 draft slot reaches the embedding
  life-guard    the scheduler remembers which request object (life) each step was scheduled for
                and gives the output to that object only: the fix for same-id resubmission
On SGLang's scheduler (`--engine sglang-scheduler`, families/sglang/variants.py):
  sglang-stale-commit   #23456 re-introduced: a late verify result of a finished or retracted
                        request still commits its accept length (EAGLE v2, overlap)
  sglang-finish-trim    the over-commit at finish fixed: the position a decode in flight booked
                        is given back at the release (no speculation, overlap)
  sglang-stream-hold    a retracted input_embeds request's stream holds until its new generation
                        passes what was sent (no token sent twice; #39645's class)
  sglang-adaptive-reserve-current  before #36897: a decode batch's KV is reserved for the draft
                        width in force at scheduling (adaptive speculation)
  sglang-session-commits-computed  a streaming turn hands its session the KV its forwards
                        computed, not the finished length (the over-claim of 0.5.23)
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from specreplay.replay.impls.hook_api import checked
from specreplay.replay.models.messages import SchedulerOutput
from specreplay.replay.models.scheduler import AsyncScheduler, Scheduler
from specreplay.replay.workloads.config import EngineConfig
from specreplay.traces.errors import InputError
from specreplay.traces.header import ImplHeader

if TYPE_CHECKING:
    from specreplay.replay.workloads.oracle import Oracle

EXECUTORS = ("inproc", "multiproc")


@dataclass(frozen=True)
class Implementation:
    """One scheduler/runner pairing and how the scheduler output reaches the worker.

    executor: "inproc" hands the worker the scheduler's own SchedulerOutput object (vLLM's
    in-process executor); "multiproc" hands it a private copy, as serialising to a worker
    process does.
    """

    name: str
    description: str
    scheduler: type[Scheduler] | None = None  # None: Scheduler (sync) / AsyncScheduler (async)
    runner: type | None = None  # None: GPUModelRunner
    executor: str = "inproc"
    user_code: bool = False  # loaded from module:attr: its exceptions are reported, not raised
    # The same variant on the real vLLM: takes the real (Async)Scheduler class, returns the
    # variant's subclass of it. None with `scheduler` set: the variant has no real-code form.
    real_scheduler: Callable[[type], type] | None = None
    # Likewise for the runner: takes vLLM's GPUModelRunner class (a live engine's), returns the
    # variant's subclass. None with `runner` set: no live form.
    real_runner: Callable[[type], type] | None = None
    real_runner_family: str = "v1"  # the runner family (engines/registry.py) real_runner subclasses
    # The variant on SGLang's scheduler (--engine sglang-scheduler; families/sglang/forms.py): takes the
    # Scheduler class the engine runs, returns the variant's subclass of it; it may declare a
    # `why_not(config)`. None: SGLang runs as released (or, with a vLLM part set, no SGLang form).
    sglang_scheduler: Callable[[type], type] | None = None
    # The reference SGLang worker's subclass a run on --engine sglang-scheduler uses (families/sglang/
    # worker.py SglangReferenceWorker, `specreplay.replay.api`), as `runner` is for vLLM's engines.
    # None: the reference SGLang worker.
    sglang_worker: type | None = None

    def why_not(self, config: EngineConfig) -> str | None:
        """Why this implementation does not apply to a workload with `config`, or None when it
        does: one line, the reason and what to pass instead. Nothing ever runs in its place:
        record, replay and compare refuse such a workload (`require_applies`, asked once per run by
        the engine's entry, engines/registry.py `Engine.refuse`: exit 2), the gate
        reports its golden `n/a`, explore draws only workloads where this is None.

        - A scheduler of the wrong mode: an `AsyncScheduler` subclass on a synchronous workload
          (it would change nothing vLLM's sync `Scheduler` does), a plain `Scheduler` subclass on
          an asynchronous one.
        - A scheduler or runner class that declares where it applies: an optional classmethod
          `why_not(cls, config) -> str | None` on it, with the same meaning as this method (the
          built-in runner variants `pr30796`, `pr30796-copy` and `noclamp` declare that they need
          draft slots, `num_spec_tokens > 0`).
        """
        if self.scheduler is not None:
            name = self.scheduler.__name__
            if config.async_scheduling and not issubclass(self.scheduler, AsyncScheduler):
                instead = "subclass AsyncScheduler for async workloads, or " if self.user_code else ""
                return (
                    f"{name} is a synchronous Scheduler and the workload uses async scheduling; "
                    f"{instead}pass a synchronous workload"
                )
            if not config.async_scheduling and issubclass(self.scheduler, AsyncScheduler):
                instead = "subclass Scheduler for synchronous workloads, or " if self.user_code else ""
                return f"{name} is an AsyncScheduler and the workload is synchronous; {instead}pass an async workload"
        for part in (self.scheduler, self.runner, self.sglang_scheduler, self.sglang_worker):
            declared = getattr(part, "why_not", None)
            reason = declared(config) if callable(declared) else None
            if reason:
                return str(reason)
        return None

    def require_applies(self, config: EngineConfig, workload: str = "the workload") -> None:
        """Refuse, in one line, a workload this implementation does not apply to (`why_not`)."""
        reason = self.why_not(config)
        if reason is not None:
            raise NotApplicable(self.name, workload, reason)

    def make_scheduler(self, config: EngineConfig) -> Scheduler:
        """The reference form of this variant's scheduler: its own class, or vLLM's default for
        the workload's mode when it changes only the runner. Never a stand-in for its class. (The
        run decided that the variant applies, before anything is built: `require_applies`.)"""
        if self.scheduler is None and self.real_scheduler is not None:
            raise InputError(
                f"{self.name} changes the real scheduler only; it has no form for --engine reference "
                "(give it a scheduler, or pass --engine vllm-scheduler)"
            )
        self.require_vllm_form("reference")
        default = AsyncScheduler if config.async_scheduling else Scheduler
        # A class handed over in Python (not through --impl) is held to the hook API here.
        return checked(self.scheduler or default)(config)

    def require_real_forms(self, engine: str, *, runner: bool = False) -> None:
        """Refuse, in one line, a variant that has no form for the real classes `engine` runs:
        vLLM's scheduler, and with `runner` its model runner too (a live vLLM)."""
        if self.scheduler is not None and self.real_scheduler is None:
            raise InputError(
                f"{self.name} changes the reference scheduler only; it has no form for "
                f"--engine {engine} (give it a real_scheduler, see docs/implementations.md)"
            )
        if runner and self.runner is not None and self.real_runner is None:
            raise InputError(
                f"{self.name} changes the reference runner only; it has no form for a live vLLM "
                "(give it a real_runner, see docs/implementations.md)"
            )

    def vllm_parts(self) -> list[str]:
        """The parts of vLLM this variant changes (its reference and real forms)."""
        return [part for part in ("scheduler", "runner", "real_scheduler", "real_runner") if getattr(self, part)]

    def require_vllm_form(self, engine: str) -> None:
        """Refuse, in one line, a variant of SGLang's scheduler alone on one of vLLM's engines:
        it changes nothing there, and nothing runs in its place."""
        if self.vllm_parts():
            return
        changed = (
            "SGLang's scheduler"
            if self.sglang_scheduler is not None
            else "the reference SGLang worker"
            if self.sglang_worker is not None
            else None
        )
        if changed:
            raise InputError(
                f"{self.name} changes {changed}; it has no form for --engine {engine} (pass --engine sglang-scheduler)"
            )

    def require_sglang_form(self, engine: str) -> None:
        """Refuse, in one line, a variant of vLLM's classes on SGLang's scheduler: they do not run there."""
        changed = self.vllm_parts()
        if changed:
            raise InputError(
                f"{self.name} changes vLLM's {changed[0].replace('real_', '')}; it has no form for --engine "
                f"{engine} (SGLang's scheduler runs as released, or as a variant of SGLang's own classes: "
                "docs/implementations.md)"
            )

    def sglang_scheduler_class(self, base: type) -> type:
        """The Scheduler class `--engine sglang-scheduler` runs for this variant: `base` (SGLang's
        Scheduler with the driver's worker constructors) or the variant's subclass of it."""
        return self.sglang_scheduler(base) if self.sglang_scheduler is not None else base

    def sglang_worker_class(self) -> type:
        """The reference SGLang worker class `--engine sglang-scheduler` builds for this variant:
        its subclass, or the reference SGLang worker."""
        if self.sglang_worker is not None:
            return self.sglang_worker
        from specreplay.replay.families.sglang.worker import SglangReferenceWorker

        return SglangReferenceWorker

    def real_scheduler_class(self, real_cls: type, config: EngineConfig) -> type:
        """The class to run on the real vLLM for this variant: `real_cls` (vLLM's Scheduler or
        AsyncScheduler for the workload's mode) or the variant's subclass of it. A variant that
        does not apply to `config` was refused before (`require_applies`), never run as `real_cls`."""
        return self.real_scheduler(real_cls) if self.real_scheduler is not None else real_cls

    def real_runner_class(self, real_cls: type, family: str = "v1") -> type:
        """The runner class a live vLLM runs for this variant: `real_cls` (of runner family
        `family`, engines/registry.py) or its subclass (a variant without a real form was refused
        before: `require_real_forms`; one whose form is for another family, there too)."""
        if self.real_runner is None:
            return real_cls
        if family != self.real_runner_family:
            raise InputError(
                f"{self.name}'s real runner form subclasses the {self.real_runner_family} runner; vLLM built "
                f"a {family} runner ({real_cls.__qualname__}): pass --runner {self.real_runner_family}"
            )
        return self.real_runner(real_cls)

    def make_runner(self, config: EngineConfig, oracle: Oracle, device: str, default: type | None = None) -> Any:
        """The reference form of this variant's runner: its own class, or `default` (the runner
        family's reference model, engines/registry.py; None: the V1 GPUModelRunner's)."""
        if self.runner is None and self.real_runner is not None:
            raise InputError(
                f"{self.name} changes the real runner only; it has no form for the reference runner "
                "(give it a runner, or pass --engine vllm)"
            )
        return checked(self.runner or default or self._runner_class())(config, oracle, device)

    def deliver(self, out: SchedulerOutput) -> SchedulerOutput:
        """How the scheduler output reaches the worker (the engine's hook)."""
        return out if self.executor == "inproc" else out.private_copy()

    def describe(
        self,
        scheduler: Any,
        engine: str = "reference",
        *,
        runner: Any = None,
        config: EngineConfig | None = None,
        models: str | None = None,
        executor: str | None = None,
        **more: Any,
    ) -> ImplHeader:
        """What made a trace, stamped into its metadata: the classes that ran (module and
        qualified name of the `scheduler` and `runner` objects, not the classes asked for; or,
        as a string, the name a vLLM process reported for what it ran), the executor (`executor`:
        the one that ran, where the engine says; default this implementation's), the engine and
        its `models` (default: specreplay's reference of `config`'s vLLM release; the engine's
        entry names its own), then `more` (what a live or attached engine adds: its model, its
        drafter, ...). `runner` None: the class `make_runner` builds."""
        if models is None:
            models = f"specreplay reference of vllm {(config or EngineConfig()).vllm_version}"
        doc = {
            "name": self.name,
            "scheduler": scheduler if isinstance(scheduler, str) else qualified_name(type(scheduler)),
            "runner": runner
            if isinstance(runner, str)
            else qualified_name(type(runner) if runner is not None else self._runner_class()),
            "executor": executor or self.executor,
            "engine": engine,
            "models": models,
        }
        return ImplHeader.from_dict({**doc, **more})  # `more` beyond the header's fields: kept in extra

    def expected(self, config: EngineConfig, real_cls: type | None = None) -> dict[str, str]:
        """The classes and executor a run of this implementation is asked to run, named as
        `describe` names them: what the gate holds a run's header to. `real_cls`: vLLM's
        (Async)Scheduler class the real-scheduler engine builds on; None: the reference engine."""
        if real_cls is None:
            scheduler = self.scheduler or (AsyncScheduler if config.async_scheduling else Scheduler)
        else:
            scheduler = self.real_scheduler_class(real_cls, config)
        return {
            "scheduler": qualified_name(scheduler),
            "runner": qualified_name(self._runner_class()),
            "executor": self.executor,
        }

    def _runner_class(self) -> type:
        from specreplay.replay.families.vllm.v1.runner import GPUModelRunner

        return self.runner or GPUModelRunner


class NotApplicable(InputError):
    """An implementation asked to run a workload it does not apply to (`Implementation.why_not`):
    bad input, refused in one line; the gate reports the golden `n/a` with `reason`."""

    def __init__(self, impl: str, workload: str, reason: str) -> None:
        self.impl = impl
        self.reason = reason
        self.workload = workload
        super().__init__(f"{impl} does not apply to {workload}: {reason}")

    def __reduce__(self):  # crosses process pools (gate --jobs, explore) whole
        return (type(self), (self.impl, self.workload, self.reason))


def qualified_name(cls: type) -> str:
    """`module.QualifiedName` of a class, as a trace header names what ran."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _builtin() -> dict[str, Implementation]:
    from specreplay.replay.families.sglang import variants as sglang_variants
    from specreplay.replay.families.vllm import variants

    items = [
        Implementation("upstream", "vLLM 0.32.0 behaviour (AsyncScheduler + V1 GPUModelRunner)"),
        Implementation(
            "pr30796",
            "worker drops draft slots of re-entering requests, editing the shared SchedulerOutput",
            runner=variants.DropReentryDraftsRunner,
            real_runner=variants.drop_reentry_drafts_on,
        ),
        Implementation(
            "pr30796-copy",
            "the pr30796 edit on a private copy of the SchedulerOutput (multiprocess executor)",
            runner=variants.DropReentryDraftsRunner,
            real_runner=variants.drop_reentry_drafts_on,
            executor="multiproc",
        ),
        Implementation(
            "sched-clear",
            "scheduler clears all -1 draft placeholders of running requests it did not schedule",
            scheduler=variants.ClearStalePlaceholdersScheduler,
            real_scheduler=variants.clear_stale_placeholders_on,
        ),
        Implementation(
            "noclamp",
            "runner of vLLM <= 0.22: no input clamp, a -1 draft reaches the embedding",
            runner=variants.NoClampRunner,
        ),
        Implementation(
            "life-guard",
            "scheduler gives an output only to the request object (life) it was scheduled "
            "for: a resubmitted id never gets its previous life's output",
            scheduler=variants.LifeGuardScheduler,
            real_scheduler=variants.life_guard_on,
        ),
        Implementation(
            "sglang-stale-commit",
            "SGLang before #23456: a verify result processed after its request finished or was retracted "
            "still commits its accept length (EAGLE v2, overlap)",
            sglang_scheduler=sglang_variants.StaleVerifyCommits(),
        ),
        Implementation(
            "sglang-finish-trim",
            "SGLang with the over-commit at finish fixed: the position a decode in flight booked is given "
            "back at the release, as without overlap (no speculation, overlap)",
            sglang_scheduler=sglang_variants.TrimInFlightAtFinish(),
        ),
        Implementation(
            "sglang-stream-hold",
            "SGLang whose output stream never goes back: a retracted input_embeds request, generating anew, "
            "sends nothing until its new output passes what its client was sent (#39645's class)",
            sglang_scheduler=sglang_variants.StreamHoldsBehindSent(),
        ),
        Implementation(
            "sglang-adaptive-reserve-current",
            "SGLang before #36897: a decode batch's KV is reserved for the draft width in force when it is "
            "scheduled, though adaptive speculation may pick a wider one when its forward starts",
            sglang_scheduler=sglang_variants.ReservesCurrentSteps(),
        ),
        Implementation(
            "sglang-session-commits-computed",
            "SGLang's streaming session keeps what a finished turn's forwards computed, where 0.5.23 keeps its "
            "finished length, a position past the KV when the turn ended on a verify's correction token",
            sglang_scheduler=sglang_variants.SessionCommitsComputed(),
        ),
    ]
    return {impl.name: impl for impl in items}


def registry() -> dict[str, Implementation]:
    return _builtin()


def resolve(name: str, *, allow_import: bool, executor: str | None = None) -> Implementation:
    """A registry name, or (only with allow_import, i.e. typed by the user) `module:attr`."""
    impls = registry()
    if name in impls:
        impl = impls[name]
    elif ":" in name and allow_import:
        impl = _load(name)
    elif ":" in name:
        raise InputError(
            f"implementation {name!r} from a trace is not in the registry; pass it "
            "with --impl yourself to load outside code"
        )
    else:
        raise InputError(
            f"unknown implementation {name!r}; known: {', '.join(impls)} (or module:attr); see `specreplay impls`"
        )
    if executor is not None:
        if executor not in EXECUTORS:
            raise InputError(f"unknown executor {executor!r}; use inproc or multiproc")
        impl = replace(impl, executor=executor)
    return impl


def _summary(obj: type, default: str) -> str:
    doc = (obj.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else default


def _importable_from_here() -> None:
    """`--impl myfix:ClearOnSkip` names a module in the working directory, as `python -m` and
    other `module:attr` tools find it; the `specreplay` console script does not put the
    directory on sys.path by itself (process pools and live engines inherit the directory)."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def _checked_parts(impl: Implementation) -> Implementation:
    """A user's Implementation with the scheduler and runner classes it carries held to the hook
    API (impls/hook_api.py), previous forms adapted."""
    return replace(
        impl,
        scheduler=checked(impl.scheduler) if impl.scheduler is not None else None,
        runner=checked(impl.runner) if impl.runner is not None else None,
        sglang_worker=checked(impl.sglang_worker) if impl.sglang_worker is not None else None,
    )


def _load(spec: str) -> Implementation:
    from specreplay.replay.families.sglang.forms import form_of
    from specreplay.replay.families.sglang.worker import SglangReferenceWorker
    from specreplay.replay.families.vllm.v1.runner import GPUModelRunner

    module_name, _, attr = spec.partition(":")
    _importable_from_here()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail in any way; say so in one line
        raise InputError(f"cannot import {module_name!r} for --impl {spec}: {type(exc).__name__}: {exc}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise InputError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, Implementation):
        checked(type(obj))  # its own hooks (deliver, why_not): no previous forms, a mismatch refused
        return _checked_parts(replace(obj, name=spec, user_code=True))
    if isinstance(obj, type) and issubclass(obj, Implementation):
        return _checked_parts(checked(obj)(name=spec, description=_summary(obj, spec), user_code=True))
    if isinstance(obj, type) and issubclass(obj, Scheduler):
        return Implementation(spec, _summary(obj, "user scheduler"), scheduler=checked(obj), user_code=True)
    if isinstance(obj, type) and issubclass(obj, GPUModelRunner):
        return Implementation(spec, _summary(obj, "user runner"), runner=checked(obj), user_code=True)
    if isinstance(obj, type) and issubclass(obj, SglangReferenceWorker):
        return Implementation(spec, _summary(obj, "user SGLang worker"), sglang_worker=checked(obj), user_code=True)
    form = form_of(obj) if isinstance(obj, type) else None
    if form is not None:
        return Implementation(spec, _summary(obj, "user SGLang scheduler"), sglang_scheduler=form, user_code=True)
    raise InputError(
        f"{spec} is a {type(obj).__name__}; expected an Implementation, or a subclass of "
        "specreplay.replay.models.scheduler.Scheduler or specreplay.replay.families.vllm.v1.runner.GPUModelRunner "
        "(or, for --engine sglang-scheduler, of SGLang's Scheduler or SchedulerBatchResultProcessor, or of "
        "specreplay.replay.api.SglangReferenceWorker)"
    )
