"""Deprecated path: `specreplay.replay.messages` re-exports the public names of `specreplay.replay.models.messages`.

Kept so code written against the flat layout still imports; importing it warns (DeprecationWarning).
New code imports `specreplay.replay.models.messages`; a variant imports from `specreplay.replay.api`.
An ordinary module, not an alias: the names are the same objects, the module is not.
"""

import warnings

from specreplay.replay.models.messages import *  # noqa: F403

warnings.warn(
    "specreplay.replay.messages is deprecated: import specreplay.replay.models.messages (or specreplay.replay.api)",
    DeprecationWarning,
    stacklevel=2,
)
