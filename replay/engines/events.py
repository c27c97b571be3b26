"""Control events as typed values, and the one driver that applies them to an engine.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. A workload's `[[events]]` are records of the file format
(workloads/workload.py `Event`, unchanged: the trace's workload metadata holds them as written); the
engines take each as one of the classes below (`control_event`, the one place a kind string is
read), and `apply_control` hands it to the engine's `ControlTarget`: the reference and
real-scheduler loop (engines/loop.py) and the live engine's input side (families/vllm/live.py) each
implement the six calls, in their own terms (the scheduler's methods, or vLLM's engine API), and
nothing else dispatches on a kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from specreplay.replay.workloads.workload import Event


@dataclass(frozen=True)
class Abort:
    """finish_requests([request], FINISHED_ABORTED), from the input queue."""

    step: int
    request: str


@dataclass(frozen=True)
class Resubmit:
    """The same request again under its id: a new life."""

    step: int
    request: str
    max_tokens: int | None = None  # this life's (None: the request's)


@dataclass(frozen=True)
class StreamAppend:
    """A streaming session's next input chunk (the oracle holds its tokens: InputDriver.next_chunk)."""

    step: int
    request: str
    tokens: int = 0  # prompt tokens appended
    max_tokens: int | None = None  # the turn's (None: the request's)


@dataclass(frozen=True)
class Pause:
    """vLLM's pause_scheduler: mode keep (PAUSED_ALL), wait (PAUSED_NEW) or abort."""

    step: int
    mode: str
    clear_cache: bool
    label: str  # the step_event column's name of it


@dataclass(frozen=True)
class Resume:
    """Back to UNPAUSED."""

    step: int


@dataclass(frozen=True)
class ResetPrefixCache:
    """reset_prefix_cache(reset_running_requests=reset_running)."""

    step: int
    reset_running: bool
    label: str  # the step_event column's name of it


ControlEvent = Abort | Resubmit | StreamAppend | Pause | Resume | ResetPrefixCache

#: The workload format's kind -> how its record becomes a typed event.
_FROM_RECORD: dict[str, Callable[[Event], ControlEvent]] = {
    "abort": lambda e: Abort(e.step, e.request),
    "resubmit": lambda e: Resubmit(e.step, e.request, e.max_tokens),
    "stream_append": lambda e: StreamAppend(e.step, e.request, e.tokens, e.max_tokens),
    "pause": lambda e: Pause(e.step, e.mode, e.clear_cache, e.label()),
    "resume": lambda e: Resume(e.step),
    "reset_prefix_cache": lambda e: ResetPrefixCache(e.step, e.reset_running, e.label()),
}


def control_event(event: Event) -> ControlEvent:
    """A workload's `[[events]]` record as the typed event the engines apply."""
    return _FROM_RECORD[event.kind](event)


class ControlTarget(Protocol):
    """What an engine offers the driver: one call per kind of control event."""

    def abort(self, request_ids: list[str]) -> None: ...
    def resubmit(self, request: str) -> None: ...
    def stream_append(self, request: str) -> None: ...
    def pause(self, mode: str, clear_cache: bool, label: str) -> None: ...
    def resume(self) -> None: ...
    def reset_prefix_cache(self, reset_running: bool, label: str) -> None: ...


def apply_control(event: ControlEvent, target: ControlTarget) -> None:
    """One control event, applied to an engine from its input queue (vLLM's EngineCoreProc order)."""
    match event:
        case Abort(request=rid):
            target.abort([rid])
        case Resubmit(request=rid):
            target.resubmit(rid)
        case StreamAppend(request=rid):
            target.stream_append(rid)
        case Pause(mode=mode, clear_cache=clear_cache, label=label):
            target.pause(mode, clear_cache, label)
        case Resume():
            target.resume()
        case ResetPrefixCache(reset_running=reset_running, label=label):
            target.reset_prefix_cache(reset_running, label)
        case _:
            raise TypeError(f"not a control event: {event!r}")


__all__ = [
    "Abort",
    "ControlEvent",
    "ControlTarget",
    "Pause",
    "ResetPrefixCache",
    "Resubmit",
    "Resume",
    "StreamAppend",
    "apply_control",
    "control_event",
]
