"""Deprecated path: `specreplay.replay.runner` re-exports the public names of
`specreplay.replay.families.vllm.v1.runner`.

Kept so code written against the flat layout still imports; importing it warns (DeprecationWarning).
New code imports `specreplay.replay.families.vllm.v1.runner`; a variant imports from `specreplay.replay.api`.
An ordinary module, not an alias: the names are the same objects, the module is not.
"""

import warnings

from specreplay.replay.families.vllm.v1.runner import *  # noqa: F403

warnings.warn(
    "specreplay.replay.runner is deprecated: import specreplay.replay.families.vllm.v1.runner "
    "(or specreplay.replay.api)",
    DeprecationWarning,
    stacklevel=2,
)
