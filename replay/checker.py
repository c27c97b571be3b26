"""Compatibility path: `specreplay.replay.checker` is `specreplay.replay.check.checker`.

Kept because users' implementations and emitted regression tests import it; new code imports
the package path. The alias makes both names one module object (same classes, same globals).
"""

import sys

from specreplay.replay.check import checker as _module

sys.modules[__name__] = _module
