"""Written against 0.2: subclasses a built-in variant imported from its old path."""

from specreplay.replay.impls.variants import LifeGuardScheduler


class GuardedScheduler(LifeGuardScheduler):
    pass
