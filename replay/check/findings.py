"""Findings: what the checker and the trace diff report, as frozen data.

Where it sits: replay -> **diff**. Produced by `checker.check_trace`, rendered by the CLI (table or
JSON); nothing here prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any



@dataclass(frozen=True)
class Finding:
    code: str  # stable, e.g. "X2-worker-computed-tokens"
    severity: str  # "error" | "warning"
    step: int
    request_id: str | None
    field: str  # the value that disagrees
    scheduler: Any  # the scheduler side's value (or expected value)
    worker: Any  # the worker side's value (or the ground truth)
    message: str  # one line: what disagrees and why it matters

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fails(findings: list[Finding], fail_on: str) -> bool:
    """Exit-code rule: any finding at or above the threshold."""
    if fail_on == "never":
        return False
    if fail_on == "warning":
        return bool(findings)
    return any(f.severity == "error" for f in findings)


def verdict(findings: list[Finding]) -> str:
    """ok: nothing; wasteful: warnings only; diverged: at least one error."""
    if any(f.severity == "error" for f in findings):
        return "diverged"
    return "wasteful" if findings else "ok"
