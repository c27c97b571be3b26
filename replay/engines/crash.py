"""An exception of the implementation under test is the engine's death, never specreplay's.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. vLLM's engine core dies on any exception raised in its scheduler or its
workers (the busy loop logs it and shuts the engine down), so a run here ends the same way:
`crash_outcome` reads the exception's traceback, says whose code raised it, and returns the run's
outcome `crashed` (the checker's `E1-engine-crash`), or None when the exception is specreplay's own.

Whose code a frame is, by its module:
- the implementation's: the variant's own modules (a `module:attr` class and its bases outside
  specreplay, the built-in variants), and the code it inherits and runs on: specreplay's
  reference models (`replay/models`, `replay/impls`), vLLM and SGLang;
- specreplay's own: everything else under `specreplay` (the loop, the observers, the recorder,
  the oracle, the real-scheduler adapter);
- no one's: the standard library and other third-party code (torch, numpy) speak for whoever
  called them.
The innermost frame that is someone's decides. An `ObserverError` anywhere in the exception's
chain (an implementation that caught the guard's error and raised another) is specreplay's:
observers/guard.py.

The source line the outcome names is the innermost frame in the variant's own code, the line its
author can fix, even when the exception came out of the reference code it called (a `super()`
hook fed a state the variant broke); with no frame of the variant's on the stack (upstream, or an
inherited hook failing on state a variant left), the innermost frame of the implementation.
Paths are shown relative to the working directory when under it.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
from collections.abc import Collection
from types import FrameType, TracebackType
from typing import Any

from specreplay.replay.impls.registry import Implementation
from specreplay.replay.models.messages import EngineCrash
from specreplay.traces.errors import InputError, ObserverError
from specreplay.traces.header import Outcome

#: Packages of the code an implementation inherits and runs on (prefixes of module names): the
#: reference models, vLLM, and SGLang (`--engine sglang-scheduler` runs its real scheduler).
INHERITED = ("specreplay.replay.models", "specreplay.replay.impls", "vllm", "sglang")
#: Where the classes a variant subclasses live: its bases there are not the variant's own code.
BASES = ("specreplay.replay.models", "vllm", "specreplay.replay.impls.registry", "builtins")
OWN = "specreplay"
#: A family's modules (replay/families/), by the role their file name gives them (as
#: tests/test_architecture.py's ROLES): its reference models are inherited and subclassed as the
#: models are; its built-in variants and their forms are inherited as the implementations are.
FAMILIES = "specreplay.replay.families."
MODEL_ROLES = frozenset({"runner", "worker", "batch", "states", "input_batch"})
VARIANT_ROLES = frozenset({"variants", "forms"})


def _family_role(module: str) -> str | None:
    return module.rsplit(".", 1)[-1] if module.startswith(FAMILIES) else None


def crash_outcome(exc: BaseException, impl: Implementation, scheduler: tuple[Any, ...], runner: Any) -> Outcome | None:
    """The outcome (crashed; its kind, message, exception, where, side; the caller sets the step)
    of a run that `exc` ended, when the implementation raised it; None when it is specreplay's
    (or bad input: InputError).
    `scheduler`: the objects the loop calls as the scheduler (an adapter and the real one
    behind it); `runner`: the runner."""
    if isinstance(exc, EngineCrash):  # a vLLM assert the models raise, or an unexecutable output
        outcome = Outcome(status="crashed", kind=exc.kind, message=str(exc))
        # On the real scheduler every assert becomes one (vllm_setup.asserting): a variant's own
        # assert names the variant's line.
        inner = exc.__context__
        found = crash_outcome(inner, impl, scheduler, runner) if isinstance(inner, AssertionError) else None
        if found is not None and _variant_raised(inner, impl):
            message = f"{exc}, raised in the {found.side} at {found.where}"
            outcome = dataclasses.replace(outcome, message=message, where=found.where)
        return outcome
    if not isinstance(exc, Exception) or isinstance(exc, InputError) or _observer_failed(exc):
        return None
    variant = variant_modules(impl)
    frames = [(tb.tb_frame, tb.tb_lineno) for tb in _walk(exc.__traceback__)]
    owned = [(i, owner) for i, (frame, _) in enumerate(frames) if (owner := _owner(frame, variant)) is not None]
    if not owned or owned[-1][1] == "own":
        return None
    raised = owned[-1][0]  # the innermost frame of the implementation's
    at = max((i for i, owner in owned if owner == "variant"), default=raised)
    frame, line = frames[at]
    where = f"{_path(frame.f_code.co_filename)}:{line}"
    side = _side([f for f, _ in frames], scheduler, runner, impl)
    what = " ".join(str(exc).split()) or _source(*frames[raised])  # a bare assert: its own text
    message = f"{type(exc).__name__}: {what}, raised in the {side} by {frame.f_code.co_qualname} at {where}"
    if at != raised:  # the variant's line called the code that raised
        inner, inner_line = frames[raised]
        message += f" (from {_path(inner.f_code.co_filename)}:{inner_line})"
    return Outcome(
        status="crashed",
        kind="scheduler-assert" if isinstance(exc, AssertionError) and side == "scheduler" else "engine-crash",
        message=message[:500],
        exception=type(exc).__name__,
        where=where,
        side=side,
        # Locals of the frame that raised and the variant's line only: an outer loop's `request`
        # is the last one it reached, not necessarily the one the crash is about.
        request=named_request(exc, [frames[at][0], frames[raised][0]], known_requests((*scheduler, runner))),
    )


#: The locals a frame names the request it works on by (vLLM's and the models' own names).
_ID_LOCALS = ("request_id", "req_id", "rid")
_REQUEST_LOCALS = ("request", "req")


def named_request(exc: BaseException, frames: list[FrameType], known: Collection[str]) -> str | None:
    """The request a crash happened on, when the exception or the code that raised it names one
    the engine holds: a `KeyError`'s key (the id a dropped entry was looked up by) or another
    argument of the exception, a quoted word of its message, else the request `frames` (the
    code that raised, outermost first) were working on (a local `request_id` / `req_id` /
    `rid`, or a `request` / `req` with a `request_id`), innermost first. None when nothing names
    a request the engine holds."""
    if not known:
        return None
    candidates = [a for a in getattr(exc, "args", ()) if isinstance(a, str)]
    candidates += _QUOTED.findall(str(exc))
    for frame in reversed(frames):
        local = frame.f_locals
        candidates += [local[n] for n in _ID_LOCALS if isinstance(local.get(n), str)]
        ids = (getattr(local.get(n), "request_id", None) for n in _REQUEST_LOCALS)
        candidates += [rid for rid in ids if isinstance(rid, str)]
    return next((c for c in candidates if c in known), None)


_QUOTED = re.compile(r"'([^']+)'")


def known_requests(objects: tuple[Any, ...]) -> set[str]:
    """The request ids the engine's scheduler and runner hold (their `requests` tables)."""
    known: set[str] = set()
    for obj in objects:
        table = getattr(obj, "requests", None)
        if isinstance(table, dict):
            known.update(str(k) for k in table)
    return known


def _variant_raised(exc: BaseException, impl: Implementation) -> bool:
    """Did the variant's own code raise `exc` (its innermost frame that is someone's)?"""
    variant = variant_modules(impl)
    owners = [owner for tb in _walk(exc.__traceback__) if (owner := _owner(tb.tb_frame, variant)) is not None]
    return bool(owners) and owners[-1] == "variant"


def variant_modules(impl: Implementation) -> frozenset[str]:
    """The modules of the variant's own code: its classes and their bases outside the inherited
    packages, its real-form functions, its Implementation subclass (`deliver`)."""
    found = set()
    parts: tuple[Any, ...] = (impl.scheduler, impl.runner, impl.real_scheduler, impl.real_runner)
    parts += (type(impl),) if type(impl) is not Implementation else ()
    for part in parts:
        for obj in part.__mro__ if isinstance(part, type) else (part,):
            module = getattr(obj, "__module__", None) or ""
            if module and not _under(module, BASES) and _family_role(module) not in MODEL_ROLES:
                found.add(module)
    return frozenset(found)


def _owner(frame: FrameType, variant: frozenset[str]) -> str | None:
    module = frame.f_globals.get("__name__", "")
    if module in variant:
        return "variant"
    if _under(module, INHERITED) or _family_role(module) in MODEL_ROLES | VARIANT_ROLES:
        return "inherited"
    if _under(module, (OWN,)):
        return "own"
    return None  # the standard library, torch, a helper module of the variant's: its caller decides


def _under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _walk(tb: TracebackType | None):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _observer_failed(exc: BaseException) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ObserverError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _side(frames: list, scheduler: tuple[Any, ...], runner: Any, impl: Implementation) -> str:
    """scheduler or runner: the object whose method the loop called (the outermost frame with it
    as self; while the engine is built, an instance of the variant's class)."""
    classes = (("scheduler", impl.scheduler), ("runner", impl.runner))
    for frame in frames:
        this = frame.f_locals.get("self")
        if this is None:
            continue
        if any(this is s for s in scheduler):
            return "scheduler"
        if this is runner:
            return "runner"
        for side, cls in classes:
            if cls is not None and isinstance(this, cls):
                return side
    return "engine"  # the executor hook (Implementation.deliver)


def _path(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive
        return filename
    return filename if relative.startswith("..") else relative


def _source(frame: FrameType, line: int) -> str:
    """A bare assert's own text, as vLLM's crash report names it."""
    return linecache.getline(frame.f_code.co_filename, line).strip() or "assert"


__all__ = ["crash_outcome", "named_request", "variant_modules"]
