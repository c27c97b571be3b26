"""Compatibility path: `specreplay.replay.engine` is `specreplay.replay.engines.run`.

Kept because users' implementations and emitted regression tests import it; new code imports
the package path. The alias makes both names one module object (same classes, same globals).
"""

import sys

from specreplay.replay.engines import run as _module

sys.modules[__name__] = _module
