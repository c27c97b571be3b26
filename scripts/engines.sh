#!/usr/bin/env bash
# The other engines, each in its own environment, side by side: vLLM 0.33.0's and 0.34.0's
# schedulers (scripts/vllm-0.33.sh, scripts/vllm-0.34.sh) and SGLang 0.5.23's (scripts/sglang.sh),
# each installed and then tested.
#
# Their pins cannot share the main environment nor each other's, and none needs another, so they
# run at once: most of an install is downloading and unpacking, which overlaps with the others',
# and the test runs together use the machine's two cores. Each one's output goes to a log printed
# when all are done, with how long each took; the exit status is the first failure's (0 when all
# pass).
#
# Usage: scripts/engines.sh
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

run() { # run NAME COMMAND: COMMAND's output to NAME's log, its time to NAME.time
    local name=$1 start=$SECONDS status=0
    bash -c "$2" > "$logs/$name.log" 2>&1 || status=$?
    echo "$((SECONDS - start)) s (exit $status)" > "$logs/$name.time"
    return "$status"
}

# NAME and its script: install, then test.
engines=(vllm-0.33.0:scripts/vllm-0.33.sh vllm-0.34.0:scripts/vllm-0.34.sh sglang-0.5.23:scripts/sglang.sh)
pids=()
for engine in "${engines[@]}"; do
    run "${engine%%:*}" "${engine#*:} install && ${engine#*:} test" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || { failed=$?; ((status)) || status=$failed; }
done

for engine in "${engines[@]}"; do
    name=${engine%%:*}
    echo "== $name: $(cat "$logs/$name.time")"
    cat "$logs/$name.log"
done
exit "$status"
