"""A run's outcome: how it ended, built in one place for every engine and for a merged recording.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. The engine loop (engines/run.py), the live engine (families/vllm/live.py) and a
merge of an attached recording (workflows/merge.py) each say what happened; `run_outcome` turns it
into the trace's outcome metadata (the checker's E-codes and the CLI's exit status read it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specreplay.traces.header import Outcome


def run_outcome(
    step: int,
    *,
    crash: Outcome | Mapping[str, Any] | None = None,
    cut: bool = False,
    unfinished: Sequence[str] = (),
    partial: str | None = None,
) -> Outcome:
    """The outcome of a run that stopped after engine step `step`:

    - `crash`: the engine died there (its kind and message, engines/crash.py): `crashed`;
    - `cut`: the step limit came with work left: `step_limit`;
    - `partial`: a recording lost lines or steps (what, in one line): `partial`;
    - else `completed`, naming the requests it still held (`unfinished`: lost by the engine).
    """
    if crash is not None:
        fields = crash.to_dict() if isinstance(crash, Outcome) else dict(crash)
        return Outcome.from_dict({**fields, "status": "crashed", "step": step})
    if cut:
        return Outcome(status="step_limit", step=step)
    if partial is not None:
        return Outcome(status="partial", step=step, message=partial[:500])
    if unfinished:
        return Outcome(status="completed", step=step, unfinished=tuple(unfinished))
    return Outcome(status="completed")


__all__ = ["run_outcome"]
