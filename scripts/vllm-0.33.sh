#!/usr/bin/env bash
# vLLM 0.33.0's real scheduler on a CPU machine, in its own virtual environment (scripts/vllm-wheel.sh),
# and the tests that hold it to specreplay's 0.33.0 model (the differential, the bug matrix, the
# fidelity sweep).
#
# Usage: scripts/vllm-0.33.sh install [DIR]   create DIR (default .venv-vllm-0.33) with vllm 0.33.0 + specreplay
#        scripts/vllm-0.33.sh test [DIR]      run the 0.33.0 tests in it
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/vllm-wheel.sh
vllm_wheel "${1:?usage: scripts/vllm-0.33.sh install|test [DIR]}" "${2:-.venv-vllm-0.33}" 0.33.0 5.21.0 \
    tests/replay/engines/test_vllm_scheduler.py tests/replay/workflows/test_bug_matrix.py \
    tests/replay/workflows/test_fidelity_sweep.py::test_the_ci_sweep_is_identical_and_reaches_every_setting
