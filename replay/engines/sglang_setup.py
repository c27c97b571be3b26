"""Deprecated path (0.3.0): SGLang's set-up moved to `specreplay.replay.families.sglang.setup`.

An SGLang implementation written against 0.2 called `prepare()` from here before importing
sglang; `--impl` now readies the process itself. This re-export warns once and goes in 0.4.0.
"""

from __future__ import annotations

import warnings

from specreplay.replay.families.sglang.setup import *  # noqa: F403
from specreplay.replay.families.sglang.setup import prepare  # noqa: F401

warnings.warn(
    "specreplay.replay.engines.sglang_setup moved to specreplay.replay.families.sglang.setup; "
    "--impl readies SGLang before your module is imported (this path goes in 0.4.0)",
    FutureWarning,
    stacklevel=2,
)
