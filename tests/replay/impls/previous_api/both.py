"""A user's Implementation, written against specreplay 0.2: both the fixes above, paired."""

from drops_stale import DropsStale
from no_cached_drafts import NoCachedDrafts

from specreplay.replay.api import Implementation

BOTH = Implementation("both", "drops stale outputs; no cached drafts", scheduler=DropsStale, runner=NoCachedDrafts)
