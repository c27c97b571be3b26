"""A user's vLLM program with a real KV connector, for the connector tests (not a test module).

Run as `python connector_llm.py OUT.json STORAGE`: it builds a tiny dummy-weight `vllm.LLM` with
vLLM's own ExampleConnector (kv_role kv_both: it saves each new prompt's KV under STORAGE and
loads what STORAGE holds), runs one 49-token prompt for 8 tokens, and writes what the client
received and how many prompt tokens vLLM reported as cached. A first run fills STORAGE; a second
run, a fresh engine with an empty prefix cache, gets the prompt's first block from the connector.
specreplay appears only to build the engine's arguments (vllm_setup.engine_args).
"""

from __future__ import annotations

import json
import sys

from vllm import LLM, SamplingParams

from specreplay.replay.families.vllm.setup import engine_args
from specreplay.replay.workloads.config import EngineConfig

#: The CPU attention backend takes blocks of 32 tokens (CPU_ATTN: MultipleOf(32)).
CONFIG = EngineConfig(
    max_num_batched_tokens=64,
    num_spec_tokens=0,
    async_scheduling=False,
    block_size=32,
    num_blocks=32,
    max_model_len=256,
)
PROMPT = [(7 * j) % 400 + 3 for j in range(49)]


def main() -> None:
    out_path, storage = sys.argv[1], sys.argv[2]
    args = engine_args(CONFIG)
    args["kv_transfer_config"] = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": storage},
    }
    llm = LLM(**args)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    with open(out_path, "w") as fh:
        json.dump({"tokens": list(out.outputs[0].token_ids), "cached": out.num_cached_tokens}, fh)


if __name__ == "__main__":
    main()
