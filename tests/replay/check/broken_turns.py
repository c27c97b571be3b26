"""A runner variant that keeps an ended streaming turn's token in the next turn's KV: the bug
shape the KV ground truth's re-read of a streaming turn's kept positions is for.

Test support, loaded as a user's plugin would be: `--impl tests.replay.check.broken_turns:NAME`
(from the repository root). It overrides one hook of the reference GPUModelRunner
(replay/families/vllm/v1/runner.py):

    KeepsEndedTurnToken  at a streaming session's next turn, counts one more position as
                         computed than the scheduler sent: the ended turn's last sampled token,
                         whose KV the turn's dropped in-flight step wrote under async scheduling.
                         The new turn's chunk begins at that position, so it keeps the old
                         turn's token where the chunk's first token belongs -> K1 at the turn's
                         first step
"""

from __future__ import annotations

from specreplay.replay.families.vllm.v1.runner import GPUModelRunner


class KeepsEndedTurnToken(GPUModelRunner):
    """Takes the ended turn's last sampled token as computed at a streaming session's next turn."""

    def update_streaming_request(self, data):
        # Its KV is there (the dropped in-flight step wrote it), so the runner keeps it: the
        # SchedulerOutput the worker reads now says so too.
        data.num_computed_tokens += 1
        return super().update_streaming_request(data)
