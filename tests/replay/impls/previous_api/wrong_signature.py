"""A hook that no version of the API ever had: refused in one line before anything runs."""

from specreplay.replay.api import AsyncScheduler


class WrongSignature(AsyncScheduler):
    def discard_output(self, req):
        return False
