#!/usr/bin/env bash
# vLLM 0.34.0's real scheduler on a CPU machine, in its own virtual environment (scripts/vllm-wheel.sh),
# and the tests that hold it to specreplay's 0.34.0 model (the differential on Model Runner V2,
# the only runner 0.34.0 has; the bug matrix; the whole engine live on the CPU against the
# reference MRV2; record --attach on a real `vllm serve` under real clients). The live engine needs
# Triton (its interpreter runs MRV2's kernels), compressed-tensors and the server's packages, which
# the scheduler alone does not.
#
# Usage: scripts/vllm-0.34.sh install [DIR]   create DIR (default .venv-vllm-0.34) with vllm 0.34.0 + specreplay
#        scripts/vllm-0.34.sh test [DIR]      run the 0.34.0 tests in it
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/vllm-wheel.sh
# The whole engine: Triton and compressed-tensors; `vllm serve` (record --attach): its server's imports.
live="triton==3.9.0 compressed-tensors==0.17.0 orjson prometheus-fastapi-instrumentator setproctitle blake3 ijson
    python-json-logger protobuf sentencepiece tiktoken lark jsonschema anthropic mcp mistral_common watchfiles
    model-hosting-container-standards opentelemetry-api opentelemetry-sdk"
vllm_wheel "${1:?usage: scripts/vllm-0.34.sh install|test [DIR]}" "${2:-.venv-vllm-0.34}" 0.34.0 5.23.0 \
    tests/replay/engines/test_vllm_scheduler.py tests/replay/workflows/test_bug_matrix.py \
    tests/replay/families/vllm/test_live_0_34.py tests/replay/families/vllm/test_attach_0_34.py
