"""The run as a whole, from the trace's outcome: the engine does not die, and every request finishes.

Codes: E1 (the engine crashed: a vLLM assert, or any exception the implementation raised,
engines/crash.py), X5-negative-input-id (it crashed because a negative id reached
the embedding: a device-side assert on a GPU), G7 (on an SGLang trace, the crash is SGLang's own
invariant checker failing: which check, from rules_sglang.py, and SGLang's message, instead of a
bare E1), E2 (the run hit the step limit, or went idle with requests held for good). These rules
run once, after the last frame (scope "run").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.rules_sglang import own_check
from specreplay.traces.families import EngineLine, traits

if TYPE_CHECKING:
    from specreplay.replay.check.frames import Frame
    from specreplay.replay.check.framework import Checker


def check_run_completes(_frame: Frame | None, chk: Checker) -> Iterable[Finding]:
    """E2: no request is left unfinished (the step limit), none held for good by an idle engine."""
    if chk.outcome.status == "completed":  # the requests the scheduler held when it went idle
        unfinished = [str(rid) for rid in chk.outcome.unfinished or ()]
    else:  # cut by the step limit: requests whose last row is not finished
        unfinished = chk.unfinished()
    yield from incomplete_findings(chk, unfinished)


def incomplete_findings(chk: Checker, unfinished: list[str]) -> Iterable[Finding]:
    """E2 for a run cut by the step limit, or one that completed with requests held for good."""
    outcome = chk.outcome
    if outcome.status == "step_limit":
        yield chk.run_finding(
            "E2-run-incomplete",
            outcome.step or 0,
            unfinished[0] if unfinished else None,
            "outcome",
            0,
            len(unfinished),
            status="step_limit",
            unfinished=tuple(unfinished),
        )
    elif outcome.status == "completed" and unfinished:
        yield chk.run_finding(
            "E2-run-incomplete",
            int(outcome.step or 0),
            unfinished[0],
            "outcome",
            0,
            len(unfinished),
            status="completed",
            unfinished=tuple(unfinished),
        )


def check_crash(_frame: Frame | None, chk: Checker) -> Iterable[Finding]:
    """E1, or X5-negative-input-id for the crash kind that is a negative id in the model's input,
    or (SGLang) G7 for a failure of SGLang's own invariant checker."""
    if chk.crash_step is None:
        return
    message = chk.outcome.message if chk.outcome.message is not None else "engine crashed"
    rid = chk.outcome.request  # named from the exception (engines/crash.py), else vLLM's phrase
    marker = "request '"
    if rid is None and marker in message:
        rid = message.split(marker, 1)[1].split("'", 1)[0]
    if rid is None and chk.crash_inputs:  # no name in the crash: the request whose inputs the model could not embed
        rid = chk.crash_inputs[0]
    check = (
        own_check(chk.outcome.message, chk.outcome.where)
        if traits(chk.runner_family).line is EngineLine.SGLANG
        else None
    )
    if check is not None:
        yield chk.run_finding(
            "G7-sglang-own-check",
            chk.crash_step,
            rid,
            "invariant_checker",
            None,
            check.name,
            check=check.name,
            check_source=check.source,
            check_function=check.function,
            outcome_message=message,
            where=chk.outcome.where,
        )
    elif chk.outcome.kind in (None, "negative-input-id"):  # no kind: traces from before kinds were recorded
        yield chk.run_finding(
            "X5-negative-input-id", chk.crash_step, rid, "input_ids", None, -1, outcome_message=message
        )
    elif chk.outcome.exception is not None:  # the implementation raised: its type and source line are the evidence
        yield chk.run_finding(
            "E1-engine-crash",
            chk.crash_step,
            rid,
            "exception",
            None,
            chk.outcome.exception,
            outcome_message=message,
            where=chk.outcome.where,
            side=chk.outcome.side,
        )
    else:
        yield chk.run_finding(
            "E1-engine-crash", chk.crash_step, rid, "scheduler_output", None, None, outcome_message=message
        )
