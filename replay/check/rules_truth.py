"""The ground truth: the tokens applied and the KV cache's content against the oracle's.

Codes: T1 (an applied token differs from the request's expected sequence), K1 (the KV cache no
longer holds the expected tokens in every valid position). The recorder fills the truth columns
(null in a live engine's trace: then nothing fires). The message texts are in the catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import Frame

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def check_tokens(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """T1: every applied token equals the expected sequence (first per request)."""
    c = frame.c
    mismatches, applied = c["apply_token_mismatches"], c["apply_num_tokens"]
    for i in chk.first_per_request("T1-wrong-token", frame, mismatches != 0):
        yield chk.finding(
            frame, "T1-wrong-token", i, "output_token_ids", 0, int(mismatches[i]), apply_num_tokens=int(applied[i])
        )


def check_kv_truth(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """K1: where the request ran, every valid KV position holds its expected token (first per request)."""
    c = frame.c
    for i in chk.first_per_request(
        "K1-kv-content", frame, c["truth_kv_not_ok"] & (c["sched_num_scheduled_tokens"] > 0)
    ):
        truth = None if c["truth_num_computed_tokens_is_null"][i] else int(c["truth_num_computed_tokens"][i])
        yield chk.finding(frame, "K1-kv-content", i, "kv_cache", True, False, truth_num_computed_tokens=truth)
