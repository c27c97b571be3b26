"""A scheduler variant that stops making progress, as a deadlocked engine does: for the hang test.

Not a test module. `ServedStall` (a subclass of vLLM's AsyncScheduler, which `LLM` runs with
`scheduler_cls="tests.replay.engines.stall_variant.ServedStall"`) blocks inside schedule() once a
running request has STALL_AT output tokens, until the file named by SPECREPLAY_TEST_RELEASE
exists: the step never returns and nothing raises, as in a deadlock, and the test decides when
(and whether) it goes on.
"""

from __future__ import annotations

import os
import time

STALL_AT = 12
RELEASE_ENV = "SPECREPLAY_TEST_RELEASE"


def _served() -> type:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    class ServedStall(AsyncScheduler):
        stalled = False

        def schedule(self, *a, **kw):
            if not self.stalled and any(r.num_output_tokens >= STALL_AT for r in self.running):
                type(self).stalled = True  # once: the engine then goes on as it was
                release = os.environ[RELEASE_ENV]
                while not os.path.exists(release):
                    time.sleep(0.05)
            return super().schedule(*a, **kw)

    return ServedStall


def __getattr__(name: str):
    # vLLM resolves scheduler_cls by its qualified name; built on first use.
    if name == "ServedStall":
        return _served()
    raise AttributeError(name)
