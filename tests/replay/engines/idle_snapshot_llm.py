"""A user's in-process vLLM program that goes idle before it is snapshotted (not a test module).

Run as `python idle_snapshot_llm.py OUT.json` with SPECREPLAY_RECORD and SPECREPLAY_WINDOW set:
a tiny dummy-weight `vllm.LLM` (async scheduling, ngram_gpu, k = 3) serves a first wave of four
requests that finish out of their arrival order (on Model Runner V2 they leave the slot
allocator's free list out of order), goes idle, then serves one request of 10 tokens to its end;
the async scheduler leaves that request unscheduled once its placeholders reach max_tokens (a
step that schedules nothing), and the next step only announces its finish. Then the program sits
idle, writes OUT.json (what the client received, per request) and waits, at most 120 s, for a
file OUT.json.stop, which the caller creates after `specreplay snapshot`; it then exits cleanly
(vLLM's own shutdown). tests/traces/data/idle-snapshot-v1/ and -v2/ were made with it
(tests/traces/make_idle_snapshot.py).
"""

from __future__ import annotations

import json
import os
import sys
import time

from vllm import LLM, SamplingParams

from specreplay.replay.families.vllm.setup import engine_args
from specreplay.replay.workloads.config import EngineConfig

WAVES = (
    [("w0-0", 14), ("w0-1", 5), ("w0-2", 9), ("w0-3", 7)],  # finish out of order
    [("last", 10)],
)


def main() -> None:
    out_path = sys.argv[1]
    config = EngineConfig(max_num_batched_tokens=32, max_num_seqs=8, num_spec_tokens=3, block_size=32, num_blocks=64)
    engine = LLM(**engine_args(config)).llm_engine
    received: dict[str, list[int]] = {}
    for n, wave in enumerate(WAVES):
        for i, (rid, max_tokens) in enumerate(wave):
            prompt = [5 + i + 7 * n, 7, 9, 11 + i] * (1 + i % 3)
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False)
            engine.add_request(rid, {"prompt_token_ids": prompt}, params)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.outputs:
                    received[out.request_id] = list(out.outputs[0].token_ids)
        # vLLM's busy loop steps on while the scheduler has finished requests to announce (its
        # has_requests()); an idle engine core's step schedules nothing and returns.
        for _ in range(3):
            engine.step()
        time.sleep(0.5)  # idle between the waves
    with open(out_path + ".tmp", "w") as fh:
        json.dump({"received": received}, fh)
    os.replace(out_path + ".tmp", out_path)
    deadline = time.monotonic() + 120
    while not os.path.exists(out_path + ".stop") and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
