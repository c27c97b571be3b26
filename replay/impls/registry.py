"""Implementations under test: a registry of scheduler + runner + executor combinations.

Where it sits: workloads -> models -> **impls** -> record -> engines -> check. `record`,
`replay` and `gate` resolve `--impl NAME` here; every engine takes a variant from here, in the
form that engine runs (the reference form on the reference models, the real form on vLLM's
classes), never by its name. A name from a
trace resolves only through this registry; `module:attr` (loaded only when the user passes it on
the command line) may name an `Implementation`, a `Scheduler` subclass or a `GPUModelRunner`
subclass.

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
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from specreplay.replay.models.messages import SchedulerOutput
from specreplay.replay.models.scheduler import AsyncScheduler, Scheduler
from specreplay.replay.workloads.config import EngineConfig
from specreplay.traces.errors import InputError

if TYPE_CHECKING:
    from specreplay.replay.models.runner import GPUModelRunner
    from specreplay.replay.workloads.oracle import Oracle

EXECUTORS = ("inproc", "multiproc")
#: reference: specreplay's models of vLLM 0.32.0; vllm-scheduler: the installed vLLM's real
#: Scheduler / AsyncScheduler with the reference runner.
ENGINES = ("reference", "vllm-scheduler", "vllm")  # vllm: a live engine, see engines/live.py


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

    def why_not(self, config: EngineConfig) -> str | None:
        """Why this implementation cannot run a workload with `config` as asked, or None when it can.

        Issue 21 extends this (runner variants whose hook the workload never reaches); explore
        draws only workloads where this is None, and record/replay/gate refuse or mark n/a the rest.
        """
        if self.scheduler is None:
            return None
        name = self.scheduler.__name__
        if config.async_scheduling and not issubclass(self.scheduler, AsyncScheduler):
            return f"{name} is a synchronous Scheduler and the workload uses async scheduling"
        if not config.async_scheduling and issubclass(self.scheduler, AsyncScheduler):
            return f"{name} is an AsyncScheduler and the workload is synchronous"
        return None

    def make_scheduler(self, config: EngineConfig) -> Scheduler:
        """The reference form of this variant's scheduler."""
        if self.scheduler is not None and config.async_scheduling and not issubclass(self.scheduler, AsyncScheduler):
            raise InputError(
                f"{self.name}: {self.scheduler.__name__} is a synchronous Scheduler but the workload uses "
                "async scheduling; subclass AsyncScheduler or set async_scheduling = false"
            )
        if self._variant_applies(config):
            return self.scheduler(config)
        return AsyncScheduler(config) if config.async_scheduling else Scheduler(config)

    def _variant_applies(self, config: EngineConfig) -> bool:
        """An AsyncScheduler variant changes async behaviour only; in sync mode the plain
        Scheduler runs (there are no placeholders to treat differently)."""
        return self.scheduler is not None and (
            config.async_scheduling or not issubclass(self.scheduler, AsyncScheduler)
        )

    def require_real_forms(self, engine: str) -> None:
        """Refuse, in one line, a variant that has no form for the real classes `engine` runs."""
        if self.scheduler is not None and self.real_scheduler is None:
            raise InputError(
                f"{self.name} changes the reference scheduler only; it has no form for "
                f"--engine {engine} (give it a real_scheduler, see the README)"
            )
        if engine == "vllm" and self.runner is not None and self.real_runner is None:
            raise InputError(
                f"{self.name} changes the reference runner only; it has no form for a live vLLM "
                "(give it a real_runner, see the README)"
            )

    def real_scheduler_class(self, real_cls: type, config: EngineConfig) -> type:
        """The class to run on the real vLLM for this variant: `real_cls` or its subclass."""
        if self.real_scheduler is not None and self._variant_applies(config):
            return self.real_scheduler(real_cls)
        return real_cls

    def real_runner_class(self, real_cls: type) -> type:
        """The runner class a live vLLM runs for this variant: `real_cls` or its subclass."""
        self.require_real_forms("vllm")
        return self.real_runner(real_cls) if self.real_runner is not None else real_cls

    def make_runner(self, config: EngineConfig, oracle: Oracle, device: str) -> GPUModelRunner:
        from specreplay.replay.models.runner import GPUModelRunner

        return (self.runner or GPUModelRunner)(config, oracle, device)

    def deliver(self, out: SchedulerOutput) -> SchedulerOutput:
        """How the scheduler output reaches the worker (the engine's hook)."""
        return out if self.executor == "inproc" else out.private_copy()

    def describe(self, scheduler: Any, engine: str = "reference") -> dict[str, Any]:
        """What made a trace: stamped into its metadata. `scheduler`: the one that ran."""
        cls = type(scheduler)
        runner = self.runner.__name__ if self.runner else "GPUModelRunner"
        if engine == "vllm-scheduler":
            import vllm

            version = f"vllm {vllm.__version__}"
        else:
            version = "specreplay reference of vllm 0.32.0"
        return {
            "name": self.name,
            "scheduler": f"{cls.__module__}.{cls.__qualname__}",
            "runner": runner,
            "executor": self.executor,
            "engine": engine,
            "models": version,
        }


def _builtin() -> dict[str, Implementation]:
    from specreplay.replay.impls import variants

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


def _load(spec: str) -> Implementation:
    from specreplay.replay.models.runner import GPUModelRunner

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
        return replace(obj, name=spec, user_code=True)
    if isinstance(obj, type) and issubclass(obj, Implementation):
        return obj(name=spec, description=_summary(obj, spec), user_code=True)
    if isinstance(obj, type) and issubclass(obj, Scheduler):
        return Implementation(spec, _summary(obj, "user scheduler"), scheduler=obj, user_code=True)
    if isinstance(obj, type) and issubclass(obj, GPUModelRunner):
        return Implementation(spec, _summary(obj, "user runner"), runner=obj, user_code=True)
    raise InputError(
        f"{spec} is a {type(obj).__name__}; expected an Implementation, or a subclass of "
        "specreplay.replay.models.scheduler.Scheduler or specreplay.replay.models.runner.GPUModelRunner"
    )
