"""Control events as typed values (engines/events.py): every kind of the workload format becomes
one class, one driver applies each to an engine's target, and every engine offers every call."""

from __future__ import annotations

import inspect

import pytest

from specreplay.replay.engines import events
from specreplay.replay.engines.events import ControlTarget, apply_control, control_event
from specreplay.replay.engines.loop import EngineLoop
from specreplay.replay.families.vllm.live import LiveInputs
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.replay.workloads.workload import EVENT_KINDS, Event

RECORDS = {
    "abort": Event(5, "abort", request="1"),
    "resubmit": Event(9, "resubmit", request="1", max_tokens=3),
    "stream_append": Event(3, "stream_append", request="s", tokens=4, max_tokens=5),
    "pause": Event(6, "pause", mode="wait", clear_cache=False),
    "resume": Event(8, "resume"),
    "reset_prefix_cache": Event(14, "reset_prefix_cache", reset_running=True),
}


def test_every_kind_of_the_format_is_one_class():
    assert sorted(RECORDS) == sorted(EVENT_KINDS)
    typed = {kind: control_event(record) for kind, record in RECORDS.items()}
    assert len({type(event) for event in typed.values()}) == len(EVENT_KINDS)
    assert typed["abort"] == events.Abort(5, "1")
    assert typed["resubmit"] == events.Resubmit(9, "1", max_tokens=3)
    assert typed["stream_append"] == events.StreamAppend(3, "s", tokens=4, max_tokens=5)
    assert typed["pause"] == events.Pause(6, "wait", False, label="pause(wait)")
    assert typed["resume"] == events.Resume(8)
    assert typed["reset_prefix_cache"] == events.ResetPrefixCache(14, True, label="reset_prefix_cache(running)")
    with pytest.raises(AttributeError):
        typed["abort"].request = "2"  # frozen


class Calls:
    """A ControlTarget that writes down what the driver called."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def test_the_driver_hands_each_event_to_its_call():
    target = Calls()
    for record in RECORDS.values():
        apply_control(control_event(record), target)
    assert target.calls == [
        ("abort", ["1"]),
        ("resubmit", "1"),
        ("stream_append", "s"),
        ("pause", "wait", False, "pause(wait)"),
        ("resume",),
        ("reset_prefix_cache", True, "reset_prefix_cache(running)"),
    ]
    with pytest.raises(TypeError, match="not a control event"):
        apply_control(RECORDS["abort"], target)  # the file's record is not applied as it is


@pytest.mark.parametrize("engine", [EngineLoop, LiveInputs])
def test_every_engine_offers_every_call_with_the_targets_signature(engine):
    for name, method in inspect.getmembers(ControlTarget, inspect.isfunction):
        if name.startswith("_"):
            continue
        theirs = inspect.signature(getattr(engine, name))
        assert list(theirs.parameters)[: len(inspect.signature(method).parameters)] == list(
            inspect.signature(method).parameters
        ), f"{engine.__name__}.{name}{theirs}"


def test_the_input_driver_hands_out_typed_events_and_the_workload_keeps_its_records():
    from specreplay.replay.engines.inputs import InputDriver
    from specreplay.replay.workloads.oracle import Oracle

    workload = build_scenario("pause-clear")
    before = workload.to_dict()
    driver = InputDriver(workload, Oracle(workload))
    popped = [e for step in range(1, 30) for e in driver.pop_events(step)]
    assert [type(e).__name__ for e in popped] == ["Pause", "Resume", "ResetPrefixCache"]
    assert workload.to_dict() == before and all(isinstance(e, Event) for e in workload.events)
