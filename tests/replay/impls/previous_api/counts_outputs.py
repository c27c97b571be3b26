"""A user's instrumented scheduler, written against specreplay 0.2: it counts outputs."""

from specreplay.replay.api import AsyncScheduler


class CountsOutputs(AsyncScheduler):
    """Counts the outputs that come back per request; schedules as upstream."""

    def take_output(self, req, n):
        self.outputs_seen = getattr(self, "outputs_seen", 0) + 1
        return super().take_output(req, n)
