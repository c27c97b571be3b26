"""Deprecated path: `specreplay.replay.scheduler` re-exports the public names of `specreplay.replay.models.scheduler`.

Kept so code written against the flat layout still imports; importing it warns (DeprecationWarning).
New code imports `specreplay.replay.models.scheduler`; a variant imports from `specreplay.replay.api`.
An ordinary module, not an alias: the names are the same objects, the module is not.
"""

import warnings

from specreplay.replay.models.scheduler import *  # noqa: F403

warnings.warn(
    "specreplay.replay.scheduler is deprecated: import specreplay.replay.models.scheduler (or specreplay.replay.api)",
    DeprecationWarning,
    stacklevel=2,
)
