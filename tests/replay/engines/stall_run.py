"""A run of a real vLLM that stalls mid-run (tests/replay/engines/stall_variant.py), recorded with a
window and the hang trigger from the environment; for test_hang_trigger.py. Not a test module.

    python -m tests.replay.engines.stall_run REQUESTS MAX_TOKENS

Prints `RESULT` and one JSON object once every request finished: each request's output length.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    requests, max_tokens = int(sys.argv[1]), int(sys.argv[2])
    from vllm import LLM, SamplingParams

    from specreplay.replay.families.vllm.setup import engine_args
    from specreplay.replay.workloads.config import EngineConfig

    config = EngineConfig(max_num_batched_tokens=256, max_num_seqs=8, num_spec_tokens=3, block_size=32, num_blocks=64)
    llm = LLM(**engine_args(config), scheduler_cls="tests.replay.engines.stall_variant.ServedStall")
    prompts = [{"prompt_token_ids": [(5 * i + j) % 300 + 3 for j in range(10)]} for i in range(requests)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    print("RESULT", json.dumps({o.request_id: len(o.outputs[0].token_ids) for o in outputs}), flush=True)


if __name__ == "__main__":
    main()
