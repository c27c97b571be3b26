"""Deprecated path: `specreplay.replay.engine` re-exports the public names of `specreplay.replay.engines.run`.

Kept so code written against the flat layout still imports; importing it warns (DeprecationWarning).
New code imports `specreplay.replay.engines.run`. An ordinary module, not an alias: the names
are the same objects, the module is not.
"""

import warnings

from specreplay.replay.engines.run import *  # noqa: F403

warnings.warn(
    "specreplay.replay.engine is deprecated: import specreplay.replay.engines.run",
    DeprecationWarning,
    stacklevel=2,
)
