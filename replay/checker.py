"""Deprecated path: `specreplay.replay.checker` re-exports the public names of `specreplay.replay.check.checker`.

Kept so code written against the flat layout still imports; importing it warns (DeprecationWarning).
New code imports `specreplay.replay.check.checker`. An ordinary module, not an alias: the names
are the same objects, the module is not.
"""

import warnings

from specreplay.replay.check.checker import *  # noqa: F403

warnings.warn(
    "specreplay.replay.checker is deprecated: import specreplay.replay.check.checker",
    DeprecationWarning,
    stacklevel=2,
)
