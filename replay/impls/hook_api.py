"""The public hook API's promise, kept when an implementation is loaded, before anything runs.

Where it sits: workloads -> models -> **impls** -> observers -> engines -> traces -> check ->
workflows -> views -> cli. `registry._load` hands every class a user names with `--impl` (and the
classes an `Implementation` of theirs carries) to `checked`: each public hook the class overrides
(`specreplay.replay.api`'s SCHEDULER_HOOKS, RUNNER_HOOKS, IMPLEMENTATION_HOOKS) must take the
arguments the engine passes it in this version of the API.

- An override that does: the class runs as written.
- An override in a previous form the API still honours (`PREVIOUS_FORMS`): the class runs
  through an adapter that calls it in its own form, and one `HookDeprecationWarning` names the
  hook, the form to move to and the version that removes the old one. Results are the same as the
  new form's (tests/replay/impls/test_previous_api.py runs implementations written against the
  previous tables).
- Any other mismatch: `HookSignatureError`, one line (exit 2) naming the class, the hook, the
  signature expected and, where the API changed it, what changed and since when. Never a finding:
  a hook the engine cannot call is the user's code not fitting the API, not the engine crashing.

The adapter is a subclass of the user's class with the user's module and name, so a trace's
header names the class the user wrote. The hook's base forms accept the previous arguments too
(the new parameters have defaults), so an old override's `super()` call keeps working.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specreplay.traces.errors import InputError

#: The version of the hook tables in docs/implementations.md (the package's minor version).
API_VERSION = "0.3"


class HookDeprecationWarning(FutureWarning):
    """A hook written in a previous form of the API: it still runs, through an adapter. A
    FutureWarning, so Python shows it to the person running the command (a DeprecationWarning
    would be hidden outside `__main__`)."""


class HookSignatureError(InputError):
    """A hook override the engine cannot call: bad input, refused in one line before the run."""


@dataclass(frozen=True)
class PreviousForm:
    """A hook's form in an earlier API version that this version still runs."""

    owner: str  # the API class that defines the hook: "Scheduler", "GPUModelRunner"
    hook: str
    params: tuple[str, ...]  # the previous form's parameters, self left out
    changed_in: str  # the API version whose tables changed it
    removed_in: str  # the first version that no longer runs it
    change: str  # what changed, one phrase
    # old bound-less function -> a function in the current form that calls it
    adapt: Callable[[Callable[..., Any]], Callable[..., Any]]


def _take_output(old: Callable[..., Any]) -> Callable[..., Any]:
    def take_output(self: Any, req: Any, n: int, generated: Any = ()) -> Any:
        return old(self, req, n)

    return take_output


def _discard_output(old: Callable[..., Any]) -> Callable[..., Any]:
    def discard_output(self: Any, req: Any, stale: bool, generated: Any = ()) -> Any:
        return old(self, req, stale)

    return discard_output


def _scatter_prev_sampled(old: Callable[..., Any]) -> Callable[..., Any]:
    def scatter_prev_sampled(
        self: Any,
        ids: Any,
        token_at: Any,
        token_rows: Any,
        draft_at: Any,
        draft_slots: Any,
        rows: Any = None,
        token_of: Any = None,
        draft_of: Any = None,
    ) -> Any:
        return old(self, ids, token_at, token_rows, draft_at, draft_slots)

    return scatter_prev_sampled


#: Every hook form an earlier API had that this one still runs (with a warning).
PREVIOUS_FORMS = (
    PreviousForm(
        "Scheduler",
        "take_output",
        ("req", "n"),
        "0.3",
        "0.4",
        "gained `generated` (the worker's tokens for the request)",
        _take_output,
    ),
    PreviousForm(
        "Scheduler",
        "discard_output",
        ("req", "stale"),
        "0.3",
        "0.4",
        "gained `generated` (the worker's tokens for the request)",
        _discard_output,
    ),
    PreviousForm(
        "GPUModelRunner",
        "scatter_prev_sampled",
        ("ids", "token_at", "token_rows", "draft_at", "draft_slots"),
        "0.3",
        "0.4",
        "gained `rows, token_of, draft_of` (whose entry each is)",
        _scatter_prev_sampled,
    ),
)


def checked(cls: type) -> type:
    """`cls` if every public hook it overrides takes this API's arguments; a subclass running the
    previous forms it uses through adapters (one warning each); else HookSignatureError."""
    from specreplay.replay import api

    tables = _tables(cls, api)
    adapters: dict[str, Callable[..., Any]] = {}
    for owner, hooks in tables:
        for hook in hooks:
            defined_by = _overridden_by_user(cls, hook)
            if defined_by is None:
                continue
            method = inspect.getattr_static(defined_by, hook)
            function = getattr(method, "__func__", method)
            expected = _params(getattr(owner, hook))
            if _accepts(function, len(expected)):
                continue
            form = _previous_form(owner, hook, function)
            where = f"{defined_by.__module__}.{defined_by.__qualname__}.{hook}"
            if form is None:
                raise HookSignatureError(_mismatch(where, hook, function, expected, owner))
            warnings.warn(
                f"{where}({', '.join(form.params)}) is the hook's form before API {form.changed_in}; "
                f"it runs through an adapter until {form.removed_in}: write {hook}({', '.join(expected)}) "
                f"({form.change})",
                HookDeprecationWarning,
                stacklevel=2,
            )
            adapters[hook] = form.adapt(function)
    if not adapters:
        return cls
    adapted = type(cls.__name__, (cls,), {**adapters, "__module__": cls.__module__, "__doc__": cls.__doc__})
    adapted.__qualname__ = cls.__qualname__
    return adapted


def _tables(cls: type, api: Any) -> list[tuple[type, tuple[str, ...]]]:
    """(the API class, its hook names) for what `cls` subclasses."""
    from specreplay.replay.impls.registry import Implementation

    tables: list[tuple[type, tuple[str, ...]]] = []
    if issubclass(cls, api.Scheduler):
        owner = api.AsyncScheduler if issubclass(cls, api.AsyncScheduler) else api.Scheduler
        tables.append((owner, tuple(h for h in api.SCHEDULER_HOOKS if hasattr(owner, h))))
    if issubclass(cls, api.GPUModelRunner):
        tables.append((api.GPUModelRunner, api.RUNNER_HOOKS))
    if issubclass(cls, Implementation):
        tables.append((Implementation, api.IMPLEMENTATION_HOOKS))
    if issubclass(cls, api.SglangReferenceWorker):
        tables.append((api.SglangReferenceWorker, api.SGLANG_WORKER_HOOKS))
    return tables


def _overridden_by_user(cls: type, hook: str) -> type | None:
    """The class in `cls`'s MRO that defines `hook`, when it is not specreplay's own."""
    for klass in cls.__mro__:
        if hook in vars(klass):
            return None if klass.__module__.startswith("specreplay.") else klass
    return None


def _params(function: Callable[..., Any]) -> list[str]:
    """A hook's parameters as the API writes them, self left out."""
    return [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]


def _accepts(function: Callable[..., Any], count: int) -> bool:
    """Does `function` (unbound) take self and `count` positional arguments?"""
    try:
        inspect.signature(function).bind(None, *range(count))
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): let it run
        return True
    return True


def _forms_of(owner: type, hook: str) -> list[PreviousForm]:
    """The previous forms of `owner`'s hook (a form of Scheduler's is AsyncScheduler's too)."""
    names = {klass.__name__ for klass in owner.__mro__}
    return [form for form in PREVIOUS_FORMS if form.owner in names and form.hook == hook]


def _previous_form(owner: type, hook: str, function: Callable[..., Any]) -> PreviousForm | None:
    return next((form for form in _forms_of(owner, hook) if _accepts(function, len(form.params))), None)


def _mismatch(where: str, hook: str, function: Callable[..., Any], expected: list[str], owner: type) -> str:
    try:
        written = str(inspect.signature(function))
    except ValueError:
        written = "(...)"
    changes = _forms_of(owner, hook)
    since = f"; changed in API {changes[0].changed_in}: {changes[0].change}" if changes else ""
    return (
        f"{where}{written} does not take the arguments the engine passes: hook API {API_VERSION} calls "
        f"{hook}({', '.join(expected)}){since} (docs/implementations.md)"
    )
