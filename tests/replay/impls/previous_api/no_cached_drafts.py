"""A user's runner, written against specreplay 0.2: the cached drafts are never scattered."""

from specreplay.replay.api import GPUModelRunner


class NoCachedDrafts(GPUModelRunner):
    """Scatters the previous sampled tokens only: the draft slots keep what the gather put there."""

    def scatter_prev_sampled(self, ids, token_at, token_rows, draft_at, draft_slots):
        super().scatter_prev_sampled(ids, token_at, token_rows, [], [])
