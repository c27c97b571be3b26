"""A scheduler variant that dies mid-run, as a user's patched vLLM does: for the flight-recorder tests.

Not a test module. The same bug in both of specreplay's forms and in vLLM's own:

- `ServedOverrun`: a subclass of vLLM's AsyncScheduler, which a real `vllm serve` (or `LLM`) runs
  with `--scheduler-cls tests.replay.engines.overrun_variant.ServedOverrun`;
- `IMPL`: the Implementation a replay, a shrink and the emitted pytest run
  (`--impl tests.replay.engines.overrun_variant:IMPL`): the reference form on specreplay's
  models, the real form on the installed vLLM's scheduler.

The bug: schedule() asserts that no running request has LIMIT output tokens or more, a bound the
author believed max_tokens kept (it does not). The assert depends on the requests' state, not on a
step count, so it fires at the same step of a window as of the whole run: the test picks the step
by sending a request with max_tokens above LIMIT after the others.
"""

from __future__ import annotations

from specreplay.replay.impls.registry import Implementation
from specreplay.replay.models.scheduler import AsyncScheduler

LIMIT = 20


def check_running(running) -> None:
    for request in running:
        assert request.num_output_tokens < LIMIT, f"request {request.request_id!r} has run past {LIMIT} output tokens"


class ReferenceOverrun(AsyncScheduler):
    """The reference form: asserts before each schedule()."""

    def schedule(self):
        check_running(self.running)
        return super().schedule()


def real_overrun(real_cls: type) -> type:
    """The real form: the installed vLLM's scheduler class, asserting before each schedule()."""

    class RealOverrun(real_cls):
        def schedule(self, *a, **kw):
            check_running(self.running)
            return super().schedule(*a, **kw)

    RealOverrun.__qualname__ = f"RealOverrun[{real_cls.__name__}]"
    return RealOverrun


IMPL = Implementation(
    "overrun",
    "asserts no running request has LIMIT output tokens or more",
    scheduler=ReferenceOverrun,
    real_scheduler=real_overrun,
)


def _served() -> type:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler as VllmAsyncScheduler

    return real_overrun(VllmAsyncScheduler)


def __getattr__(name: str):
    # vLLM resolves --scheduler-cls by its qualified name; built on first use, so this module
    # imports without vLLM for the reference form.
    if name == "ServedOverrun":
        return _served()
    raise AttributeError(name)
