"""impls: the implementations under test, a registry of scheduler + runner + executor pairings.

Each variant has a reference form (a subclass of a models class) and, where it exists, a real
form (a subclass of vLLM's class), or an SGLang form (a subclass of SGLang's scheduler or its
batch result processor: sglang_forms.py). Imports models; engines import it.
"""

from specreplay.replay.impls.registry import (
    EXECUTORS,
    Implementation,
    registry,
    resolve,
)

__all__ = ["EXECUTORS", "Implementation", "registry", "resolve"]
