"""The flight recorder's online checks: a few of the checker's invariants, read off each part line
as it is recorded, that write the window out the moment one fails.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli, beside the window (traces/window.py), with no knowledge of vLLM. Off by
default; `SPECREPLAY_DUMP_ON=NAME[,NAME...]` (with `SPECREPLAY_WINDOW`) turns them on. They run on
the part writer's thread, on the lines it encodes anyway, never on the engine's: each reads the
columns of one line, so only what one step's line of one process shows can fire (what needs two
views or several steps is the checker's, on the merged trace).

- `negative-placeholders` (the checker's S1-placeholders-nonnegative): a request's
  num_output_placeholders below zero at a schedule() (vLLM asserts on it a little later);
- `negative-inputs` (X5's evidence: `worker_negative_inputs`): the worker fed the model input ids
  below zero before any clamp (a -1 draft placeholder on a re-entering request);
- `lost-tokens` (S8-token-lost, from the output itself): update_from_output applied a fresh
  output with fewer tokens than it carried, and finished nothing to cut it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from specreplay.traces.errors import InputError

DUMP_ON_ENV = "SPECREPLAY_DUMP_ON"


def _rows(event: dict[str, Any], column: str) -> list[tuple[int, str, Any]]:
    """(step, request id, value of `column`) for every row a line gives `column`."""
    kind = event.get("e")
    if kind == "rows" and column in event["names"]:
        names = event["names"]
        at, rid = names.index(column), names.index("request_id")
        return [(row[0], row[rid], row[at]) for row in event["rows"]]
    if kind == "cols" and column in event["cols"]:
        return [(event["step"], rid, v) for rid, v in zip(event["ids"], event["cols"][column])]
    if kind == "patch":
        return [(step, rid, values[column]) for step, rid, values in event["rows"] if column in values]
    return []


def negative_placeholders(event: dict[str, Any]) -> str | None:
    for step, rid, value in _rows(event, "sched_num_output_placeholders"):
        if value is not None and value < 0:
            return f"request {rid!r} at step {step}: num_output_placeholders {value}"
    return None


def negative_inputs(event: dict[str, Any]) -> str | None:
    for step, rid, value in _rows(event, "worker_negative_inputs"):
        if value:
            return f"request {rid!r} at step {step}: {value} input id(s) below zero fed to the model"
    return None


def lost_tokens(event: dict[str, Any]) -> str | None:
    if event.get("e") != "cols" or "apply_num_tokens" not in event["cols"]:
        return None
    cols = event["cols"]
    sampled, outcome = cols.get("apply_sampled_token_ids"), cols.get("apply_outcome")
    if sampled is None or outcome is None:
        return None
    finish = cols.get("apply_finish_reason") or [None] * len(sampled)
    for rid, applied, ids, how, why in zip(event["ids"], cols["apply_num_tokens"], sampled, outcome, finish):
        if how == "applied" and not why and ids is not None and applied is not None and applied < len(ids):
            return f"request {rid!r}, output of step {event['step']}: {applied} of its {len(ids)} tokens applied"
    return None


CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "negative-placeholders": negative_placeholders,
    "negative-inputs": negative_inputs,
    "lost-tokens": lost_tokens,
}


def online_checks() -> tuple[str, ...]:
    """The checks SPECREPLAY_DUMP_ON names, in the order given; () when unset."""
    raw = os.environ.get(DUMP_ON_ENV, "").strip()
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise InputError(f"{DUMP_ON_ENV}: no online check {unknown[0]!r}; the checks are {', '.join(CHECKS)}")
    return names


__all__ = ["CHECKS", "DUMP_ON_ENV", "online_checks"]
