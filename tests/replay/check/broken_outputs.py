"""Scheduler variants that waste steps or lose tokens: the bug shapes S9 and S8 are for.

Test support, loaded as a user's plugin would be: `--impl tests.replay.check.broken_outputs:NAME`
(from the repository root). Each overrides one hook of the reference AsyncScheduler
(replay/models/scheduler.py):

    NoMaxTokensSkip      running_demand without vLLM's max-tokens skip (vLLM <= 0.11.2's shape,
                         #27922): one step past max_tokens per finishing request -> S9
    NoMaxTokensSkipSync  the same override on the synchronous Scheduler (nothing in flight to
                         skip for: clean)
    TrimsAcceptedDrafts  append_output keeps only the first token of a fresh output: the
                         accepted drafts the worker emitted are lost -> S8
    DropsSecondOutput    append_output takes nothing of a request's second output: 0 tokens
                         applied where the worker emitted 1 or more -> S8
    LosesDraftsKeepsList append_output appends only the first token of a fresh output from a
                         copy, leaving the output's list as it came: the list says every token
                         was appended, the request's growth says one -> S8 at that step
"""

from __future__ import annotations

from specreplay.replay.models.scheduler import AsyncScheduler, Scheduler


class LiftsMaxTokens:
    """running_demand with no max_tokens limit in sight (a mixin before either scheduler)."""

    def running_demand(self, req, budget, threshold):
        # The skip reads max_tokens; with no limit it never holds, and the demand is the rest.
        limit, req.max_tokens = req.max_tokens, 1 << 30
        try:
            return super().running_demand(req, budget, threshold)
        finally:
            req.max_tokens = limit


class NoMaxTokensSkip(LiftsMaxTokens, AsyncScheduler):
    """Schedules a running request although its step in flight already reaches max_tokens."""


class NoMaxTokensSkipSync(LiftsMaxTokens, Scheduler):
    """NoMaxTokensSkip's override on the synchronous Scheduler."""


class TrimsAcceptedDrafts(AsyncScheduler):
    """Appends only the first token of a fresh output: accepted drafts are lost."""

    def append_output(self, req, tokens, stale):
        if not stale and len(tokens) > 1:
            del tokens[1:]
        return super().append_output(req, tokens, stale)


class DropsSecondOutput(AsyncScheduler):
    """Takes nothing of a request's second fresh output (counters moved, no token appended)."""

    def append_output(self, req, tokens, stale):
        if not stale and req.num_output_tokens == 1:
            del tokens[:]
            return tokens, ""
        return super().append_output(req, tokens, stale)


class LosesDraftsKeepsList(AsyncScheduler):
    """Appends only the first token of a fresh output, from a copy: the output list is untouched."""

    def append_output(self, req, tokens, stale):
        if not stale and len(tokens) > 1:
            _, finish = super().append_output(req, tokens[:1], stale)
            return tokens, finish
        return super().append_output(req, tokens, stale)
