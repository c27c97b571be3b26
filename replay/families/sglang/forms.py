"""SGLang forms: how a variant of SGLang's scheduler reaches `--engine sglang-scheduler`.

Where it sits: workloads -> models -> **impls** -> observers -> engines -> traces -> check ->
workflows -> views -> cli. An implementation's SGLang form (`Implementation.sglang_scheduler`) is
a callable that takes the Scheduler class the engine runs (families/sglang/workers.py
`DrivenScheduler`: SGLang 0.5.23's Scheduler with the driver's two worker constructors) and
returns the variant's subclass of it, as a vLLM variant's `real_scheduler` takes vLLM's class.
A variant differs from SGLang in one overridden method of one of two objects:

- the Scheduler itself (sglang.srt.managers.scheduler.Scheduler), `SchedulerSubclass`: the run's
  class is `(DrivenScheduler, Variant)`, so the driver's constructors come first and the
  variant's override next, over SGLang's own;
- its batch result processor (managers/scheduler_components/batch_result_processor.py
  SchedulerBatchResultProcessor: `Scheduler.init_batch_result_processor` builds it,
  `process_batch_result` calls it; the per-row skips, commits and finishes live there),
  `ProcessorSubclass`: the scheduler builds SGLang's processor exactly as released, then runs an
  instance of the variant's class with the same fields (the processor is a frozen dataclass).

The run's class is named after the variant (`Variant(DrivenScheduler)`), which is what the trace
header records (families/sglang/loop.py names `type(scheduler)`). A variant that overrides one of
the driver's constructors would silently lose it: refused in one line (`refuse_driver_hooks`).
Nothing here imports SGLang: a user's module has (`sglang_kind` asks sys.modules).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any, cast

from specreplay.traces.errors import InputError

#: SGLang's classes a variant subclasses, by module and name.
SCHEDULER = ("sglang.srt.managers.scheduler", "Scheduler")
PROCESSOR = ("sglang.srt.managers.scheduler_components.batch_result_processor", "SchedulerBatchResultProcessor")
#: The Scheduler methods the driver overrides to build the reference workers (families/sglang/workers.py).
DRIVER_HOOKS = ("init_tp_model_worker", "maybe_init_draft_worker")


def sglang_kind(obj: Any) -> str | None:
    """ "scheduler" or "processor" when `obj` subclasses SGLang's Scheduler or its batch result
    processor (as loaded in this process: a class that subclasses one has imported it); None otherwise."""
    if not isinstance(obj, type):
        return None
    for kind, (module, name) in (("scheduler", SCHEDULER), ("processor", PROCESSOR)):
        base = getattr(sys.modules.get(module), name, None)
        if isinstance(base, type) and issubclass(obj, base) and obj is not base:
            return kind
    return None


def refuse_driver_hooks(cls: type) -> None:
    """One InputError line if `cls` (or a base of its own, below SGLang's Scheduler) overrides a
    worker constructor the driver owns."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("sglang."):
            break
        overridden = [name for name in DRIVER_HOOKS if name in vars(klass)]
        if overridden:
            raise InputError(
                f"{cls.__qualname__} overrides Scheduler.{overridden[0]}, which --engine sglang-scheduler owns (it "
                "builds the reference SGLang worker there); override another hook (docs/implementations.md)"
            )


def named(cls: type, variant: type, base: type) -> type:
    """`cls` named as the variant on `base`: the trace header's scheduler class."""
    cls.__module__ = variant.__module__
    cls.__qualname__ = cls.__name__ = f"{variant.__qualname__}({base.__name__})"
    return cls


@dataclass(frozen=True)
class SchedulerSubclass:
    """A subclass of SGLang's Scheduler, run with the driver's worker constructors (module docstring)."""

    cls: type

    def __call__(self, base: type) -> type:
        refuse_driver_hooks(self.cls)
        return named(type("Driven", (base, self.cls), {}), self.cls, base)

    def why_not(self, config: Any) -> str | None:
        """The variant class's own `why_not(config)` classmethod, when it declares one."""
        declared = getattr(self.cls, "why_not", None)
        return declared(config) if callable(declared) else None


@dataclass(frozen=True)
class ProcessorSubclass:
    """A subclass of SGLang's SchedulerBatchResultProcessor, run as the scheduler's processor
    (module docstring)."""

    cls: type

    def __call__(self, base: type) -> type:
        processor = self.cls

        def init_batch_result_processor(scheduler: Any) -> None:
            cast(Any, base).init_batch_result_processor(scheduler)  # SGLang's construction, as released
            built = scheduler.batch_result_processor
            fields = {f.name: getattr(built, f.name) for f in dataclasses.fields(built)}
            scheduler.batch_result_processor = processor(**fields)

        driven = type("Driven", (base,), {"init_batch_result_processor": init_batch_result_processor})
        return named(driven, processor, base)

    def why_not(self, config: Any) -> str | None:
        declared = getattr(self.cls, "why_not", None)
        return declared(config) if callable(declared) else None


def form_of(cls: type) -> SchedulerSubclass | ProcessorSubclass | None:
    """The SGLang form of a user's class (`--impl module:Class`); None: not an SGLang class."""
    kind = sglang_kind(cls)
    if kind == "scheduler":
        refuse_driver_hooks(cls)
        return SchedulerSubclass(cls)
    return ProcessorSubclass(cls) if kind == "processor" else None


__all__ = [
    "DRIVER_HOOKS",
    "ProcessorSubclass",
    "SchedulerSubclass",
    "form_of",
    "named",
    "refuse_driver_hooks",
    "sglang_kind",
]
