"""The GPU rows of the benchmarks: the reference engine on `--device cuda` against `cpu`.

Where it sits: beside benchmarks/run.py (its `gpu` figure, alone). One short script for a
machine with CUDA; without CUDA it says so and exits 0:

    python -m benchmarks.gpu                       # 256, 1,024, 4,096 and 16,384 requests, 50 steps
    python -m benchmarks.gpu --quick --json gpu.json   # 20 steps
"""

from __future__ import annotations

import sys

from benchmarks.run import main

if __name__ == "__main__":
    main(["--only", "gpu", *sys.argv[1:]])
