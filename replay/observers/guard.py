"""The guard around every observer call: a failure of specreplay is never the engine's.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. The observers run inside the engine's own calls (they wrap `schedule`,
`update_from_output`, `execute_model`, ...), so an exception of theirs would surface as the
engine's: a run of specreplay's would be recorded as an engine crash, and a user's own vLLM would
die of a recorder bug. Every observer call goes through `GUARD.call`, which turns such an exception
into `ObserverError` and, before anything else, tells the process's reporters (the live engine's and
attached runs' part files get an `error` line, so a failure inside another process is known where
the run is merged). Then:

- `raise` (specreplay drives the engine: the reference, vllm-scheduler and live engines): the
  error propagates; the CLI reports it as specreplay's own, exit 3;
- `stop` (attached to a user's vLLM): observation stops in this process and the engine goes on
  untouched; `merge` reports where the recording stopped and why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specreplay.traces.errors import ObserverError


class Guard:
    def __init__(self) -> None:
        self.on_failure = "raise"  # or "stop"
        self.failed: str | None = None
        self.reporters: dict[str, Callable[[str], None]] = {}  # by role: the latest attach's

    def call(self, who: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.failed is not None and self.on_failure == "stop":
            return None
        try:
            return fn(*args)
        except ObserverError:
            raise
        except Exception as exc:
            message = f"specreplay's {who} failed: {type(exc).__name__}: {exc}"
            self.failed = message
            for report in list(self.reporters.values()):
                try:
                    report(message)
                except Exception:  # a reporter that fails too must not hide the first failure
                    pass
            if self.on_failure == "stop":
                return None
            raise ObserverError(message) from exc


#: One per process: the observers of a process share their fate.
GUARD = Guard()

__all__ = ["GUARD", "Guard"]
