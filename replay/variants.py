"""Deprecated path: `specreplay.replay.variants` re-exports the public names of
`specreplay.replay.families.vllm.variants`.

Kept so code written against the flat layout still imports; importing it warns (DeprecationWarning).
New code imports `specreplay.replay.families.vllm.variants`; a variant imports from `specreplay.replay.api`.
An ordinary module, not an alias: the names are the same objects, the module is not.
"""

import warnings

from specreplay.replay.families.vllm.variants import *  # noqa: F403

warnings.warn(
    "specreplay.replay.variants is deprecated: import specreplay.replay.families.vllm.variants "
    "(or specreplay.replay.api)",
    DeprecationWarning,
    stacklevel=2,
)
