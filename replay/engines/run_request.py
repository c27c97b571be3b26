"""One run, as every engine receives it.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. `run_workload` (engines/run.py) builds one `RunRequest` and hands it to
the engine: the loop engines drive a scheduler and a reference runner with it, the engines that
drive themselves (a live vLLM, SGLang's event loop) run it whole. Every engine gets the same
guarantees from it: the journal (`journal`, settled rows appended every `flush_every` steps and
everything recorded on any exception, so `specreplay recover` has what a killed run recorded) and
the progress callback.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specreplay.replay.observers.recorder import FLUSH_EVERY

if TYPE_CHECKING:
    from specreplay.replay.impls.registry import Implementation
    from specreplay.replay.workloads.oracle import Oracle
    from specreplay.replay.workloads.workload import Workload

ProgressFn = Callable[[int, int], None]  # (steps done, max steps)


@dataclass(frozen=True)
class RunRequest:
    """What to run, where, and what to keep while it runs."""

    workload: Workload
    impl: Implementation
    device: str = "cpu"
    progress: ProgressFn | None = None
    model: str | None = None  # a live vLLM's model (None: the tiny dummy-weight one)
    runner: str | None = None  # the runner family (engines/registry.py; None: the engine's default)
    drafter: str | None = None  # a live vLLM's drafter (families/vllm/drafters.py)
    oracle: Oracle | None = None  # the outcomes (None: the workload's synthetic ones)
    journal: str | os.PathLike[str] | None = None  # where settled rows go while it runs (traces/journal.py)
    flush_every: int = FLUSH_EVERY
