"""Findings: what the checker and the trace diff report, as frozen data.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> **check** ->
workflows -> views -> cli. Produced by `checker.check_trace` (and the trace diff), rendered by the
CLI (table or JSON); nothing here prints.

A finding is evidence: besides where it fires (step, request) and the one-line message, it
carries what the rule expected, what the trace holds instead, the request's life, and the other
values the rule read or derived (`detail`, by trace column name where the value is one). The
message is rendered from that evidence (one template per code, in the catalogue).

`scheduler` and `worker` are the two values specreplay 0.1 reported (which side is which varies
by code: the catalogue row says); they stay, with the same values, for JSON consumers.

A request id can have several lives (a resubmission under the same id: the trace's sched_life).
Every finding about a request carries its `life`, and `lives`, how many lives the id has in the
trace (filled by the checker once the trace is read); reports name the life only where the id
has more than one (`request_label`: "1 (life 2)"), JSON always carries it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

#: The keys of a finding in specreplay 0.1's JSON (`specreplay diff --json`, documented in docs/checker.md).
BASE_KEYS = ("code", "severity", "step", "request_id", "field", "scheduler", "worker", "message")


@dataclass(frozen=True)
class Finding:
    code: str  # stable, e.g. "X2-sched-worker-computed"
    severity: str  # "error" | "warning"
    step: int
    request_id: str | None
    field: str  # the value that disagrees
    scheduler: Any  # the scheduler side's value (or expected value)
    worker: Any  # the worker side's value (or the ground truth)
    message: str  # one line: what disagrees and why it matters
    # The evidence, named.
    expected: Any = None  # what the rule derives `field` must be (None: the rule bounds it rather than derives it)
    actual: Any = None  # what the trace holds instead
    life: int | None = None  # the request's life (the trace's sched_life); None where no request
    detail: tuple[tuple[str, Any], ...] = ()  # the other values the rule read or derived, by name
    # How many lives the request id has in the trace (None: not counted). A rendering hint, not
    # evidence: two findings that differ only here are the same finding.
    # (dataclasses.field by its module: this class has a field named `field`)
    lives: int | None = dataclasses.field(default=None, compare=False)

    def facts(self) -> dict[str, Any]:
        """`detail` as a dict."""
        return dict(self.detail)

    def to_dict(self, evidence: bool = True) -> dict[str, Any]:
        """The 0.1 keys, then (with `evidence`) expected, actual, life and detail (a dict)."""
        doc = asdict(self)
        del doc["lives"]
        if not evidence:
            return {key: doc[key] for key in BASE_KEYS}
        doc["detail"] = self.facts()
        return doc

    @property
    def life_note(self) -> str:
        """The suffix naming the request's life, " (life N)", when its id has more than one life
        in the trace (a life past the first says so by itself); "" otherwise."""
        if self.request_id is None or self.life is None:
            return ""
        return f" (life {self.life})" if self.life > 0 or (self.lives or 0) > 1 else ""

    @property
    def request_label(self) -> str:
        """The request as a report names it: its id, and its life where the id has several."""
        return "-" if self.request_id is None else f"{self.request_id}{self.life_note}"


def fails(findings: list[Finding], fail_on: str) -> bool:
    """Exit-code rule: any finding at or above the threshold."""
    if fail_on == "never":
        return False
    if fail_on == "warning":
        return bool(findings)
    return any(f.severity == "error" for f in findings)


#: The verdict of a trace that holds no recorded step (`steps` 0): nothing was checked, so never ok.
EMPTY = "empty"
EMPTY_NOTE = "the trace holds no recorded step: nothing was checked"


def verdict(findings: list[Finding], steps: int | None = None) -> str:
    """ok: nothing; wasteful: warnings only; diverged: at least one error; empty: the trace holds
    no step (`steps` 0, where the caller knows it), whatever the findings."""
    if steps == 0:
        return EMPTY
    if any(f.severity == "error" for f in findings):
        return "diverged"
    return "wasteful" if findings else "ok"
