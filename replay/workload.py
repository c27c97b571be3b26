"""Deprecated path: `specreplay.replay.workload` re-exports the public names of `specreplay.replay.workloads.workload`.

Kept so code written against the flat layout still imports; importing it warns (DeprecationWarning).
New code imports `specreplay.replay.workloads.workload`. An ordinary module, not an alias: the names
are the same objects, the module is not.
"""

import warnings

from specreplay.replay.workloads.workload import *  # noqa: F403

warnings.warn(
    "specreplay.replay.workload is deprecated: import specreplay.replay.workloads.workload",
    DeprecationWarning,
    stacklevel=2,
)
