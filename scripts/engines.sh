#!/usr/bin/env bash
# The other engines, each in its own environment, side by side: vLLM 0.33.0's scheduler
# (scripts/vllm-0.33.sh) and SGLang 0.5.23's (scripts/sglang.sh), each installed and then tested.
#
# Their pins cannot share the main environment nor each other's, and neither needs the other, so
# they run at once: most of an install is downloading and unpacking, which overlaps with the
# other's, and the two test runs together use the machine's two cores. Each one's output goes to a
# log printed when both are done, with how long each took; the exit status is the first failure's
# (0 when both pass).
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

run vllm-0.33.0 "scripts/vllm-0.33.sh install && scripts/vllm-0.33.sh test" &
vllm=$!
run sglang-0.5.23 "scripts/sglang.sh install && scripts/sglang.sh test" &
sglang=$!
status=0
wait "$vllm" || status=$?
wait "$sglang" || { other=$?; ((status)) || status=$other; }

for name in vllm-0.33.0 sglang-0.5.23; do
    echo "== $name: $(cat "$logs/$name.time")"
    cat "$logs/$name.log"
done
exit "$status"
