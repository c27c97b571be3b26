"""Deprecated path (0.3.0): the built-in vLLM variants moved to `specreplay.replay.families.vllm.variants`.

Implementations written against 0.2 imported the variants to subclass from here; the public API
(`specreplay.replay.api`) exports them now. This re-export warns once and goes in 0.4.0.
"""

from __future__ import annotations

import warnings

from specreplay.replay.families.vllm.variants import *  # noqa: F403

warnings.warn(
    "specreplay.replay.impls.variants moved: import the variants from specreplay.replay.api (this path goes in 0.4.0)",
    FutureWarning,
    stacklevel=2,
)
