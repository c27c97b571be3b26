"""Implementations under test that raise, as a plugin's bug does, at a step the tests know.

Loaded as a user's would be: `--impl tests.replay.engines.raising_impls:NAME` (tests/replay/
engines/test_impl_raises.py; RefusingRunner also by tests/traces/test_journal.py and
tests/replay/workflows/test_recording_unit.py). Each variant counts the engine steps it takes
part in itself (no class-level state) and breaks at CRASH_STEP.
"""

from __future__ import annotations

from specreplay.replay.families.vllm.v1.runner import GPUModelRunner
from specreplay.replay.impls.registry import Implementation
from specreplay.replay.models.scheduler import AsyncScheduler
from specreplay.traces.errors import InputError

CRASH_STEP = 6


class ForgetfulRunner(GPUModelRunner):
    """Keeps each request's prompt length in a table of its own, which it forgets to fill for the
    requests of step CRASH_STEP: the cached-request hook's lookup raises KeyError there."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps = 0
        self.prompt_lens: dict[str, int] = {}

    def remove_finished(self, out):  # the first hook of every step
        self.steps += 1
        if self.steps < CRASH_STEP:
            self.prompt_lens.update((rid, len(st.prompt_token_ids)) for rid, st in self.requests.items())
        else:
            self.prompt_lens.clear()
        super().remove_finished(out)

    def update_cached_request(self, out, i, rid, deferred):
        if self.prompt_lens[rid] > self.config.max_model_len:  # KeyError at CRASH_STEP
            raise ValueError(f"{rid}: prompt longer than the model")
        return super().update_cached_request(out, i, rid, deferred)


class SwallowingRunner(GPUModelRunner):
    """Catches whatever its step raises and raises an error of its own instead (hiding the
    observer's error, when one of specreplay's observers failed inside the step)."""

    def execute_model(self, out):
        try:
            return super().execute_model(out)
        except Exception as exc:
            raise RuntimeError("SwallowingRunner: the step failed") from exc


class AssertingScheduler(AsyncScheduler):
    """Asserts, after scheduling, a bound it breaks at step CRASH_STEP (a bare assert, as vLLM's are)."""

    def update_after_schedule(self, out):
        super().update_after_schedule(out)
        assert self.step < CRASH_STEP


def asserting_on(real_cls: type) -> type:
    """AssertingScheduler's real form, for --engine vllm-scheduler: the same assert in vLLM's
    `_update_after_schedule`, counting the steps itself."""

    class RealAsserting(real_cls):
        def _update_after_schedule(self, scheduler_output):
            super()._update_after_schedule(scheduler_output)
            self.steps_seen = getattr(self, "steps_seen", 0) + 1
            assert self.steps_seen < CRASH_STEP

    return RealAsserting


def forgetful_on(real_cls: type) -> type:
    """A real-scheduler variant whose hook raises KeyError at step CRASH_STEP."""

    class RealForgetful(real_cls):
        def _update_after_schedule(self, scheduler_output):
            super()._update_after_schedule(scheduler_output)
            self.steps_seen = getattr(self, "steps_seen", 0) + 1
            if self.steps_seen == CRASH_STEP:
                {}["num_lookahead"]  # noqa: B018 -- the bug: a lookup in a table never filled

    return RealForgetful


#: The scheduler variant with its real form (both engines).
ASSERTING = Implementation(
    "asserting", "AssertingScheduler on both engines", scheduler=AssertingScheduler, real_scheduler=asserting_on
)
#: A real-scheduler variant that raises KeyError (its reference form is the plain AsyncScheduler).
FORGETFUL_REAL = Implementation(
    "forgetful-real", "a real-scheduler hook raising KeyError", scheduler=AsyncScheduler, real_scheduler=forgetful_on
)


class BrokenAtStart(AsyncScheduler):
    """Raises while the engine is built: no step runs."""

    def __init__(self, config) -> None:
        super().__init__(config)
        raise RuntimeError("no config for the plugin")


#: Both variants in one Implementation, the runner's bug first.
BOTH = Implementation("both", "the two raising variants", scheduler=AssertingScheduler, runner=ForgetfulRunner)


def not_an_implementation():
    """A function: not a class of any kind --impl takes."""


class RefusingRunner(GPUModelRunner):
    """Raises InputError inside step CRASH_STEP's execute_model: a run stopped by an input error,
    which leaves the journal to recover (an exception of its own would be the engine's death, a
    crashed trace). Shared by the journal and recording-workflow tests."""

    def execute_model(self, out):
        if out.step == CRASH_STEP:
            raise InputError(f"the runner refuses step {CRASH_STEP}")
        return super().execute_model(out)
