"""Deprecated path: `specreplay.replay.variants` re-exports the public names of `specreplay.replay.impls.variants`.

Kept so code written against the flat layout still imports; importing it warns (DeprecationWarning).
New code imports `specreplay.replay.impls.variants`; a variant imports from `specreplay.replay.api`.
An ordinary module, not an alias: the names are the same objects, the module is not.
"""

import warnings

from specreplay.replay.impls.variants import *  # noqa: F403

warnings.warn(
    "specreplay.replay.variants is deprecated: import specreplay.replay.impls.variants (or specreplay.replay.api)",
    DeprecationWarning,
    stacklevel=2,
)
