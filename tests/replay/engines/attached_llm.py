"""A user's own in-process vLLM program, for the attached-recording tests (not a test module).

Run as `python attached_llm.py OUT.json [--steps N] [--slow] [--generate]` with SPECREPLAY_RECORD
set: it builds a tiny dummy-weight `vllm.LLM` (async scheduling, ngram_gpu, k = 3), feeds
requests through the engine's own API (arrivals over several steps, one abort), steps it to the
end (or N steps, then sleeps until killed with --slow) and writes what the client received per
request; with --generate, one `LLM.generate` call on ten prompts instead.
specreplay appears only to build the engine's arguments (vllm_setup.engine_args: the tiny model's config.json).
"""

from __future__ import annotations

import json
import sys
import time

from vllm import LLM, SamplingParams

from specreplay.replay.families.vllm.setup import engine_args
from specreplay.replay.workloads.config import EngineConfig


def main() -> None:
    out_path = sys.argv[1]
    steps_limit = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else None
    config = EngineConfig(max_num_batched_tokens=32, max_num_seqs=8, num_spec_tokens=3, block_size=32, num_blocks=64)
    llm = LLM(**engine_args(config))  # async scheduling (the config's default), ngram_gpu, k = 3
    if "--generate" in sys.argv:  # the everyday call: LLM.generate on a batch of prompts
        generate(llm, out_path)
        return
    engine = llm.llm_engine
    sent: dict[str, dict] = {}
    received: dict[str, list[int]] = {}
    step = 0
    while True:
        step += 1
        if step <= 6:  # two arrivals per step over the first six steps
            for i in (2 * step - 2, 2 * step - 1):
                rid = f"user-{i}"
                prompt = [5 + i, 7, 9, 11 + i] * (1 + i % 3)
                max_tokens = 6 + 3 * i
                params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False)
                engine.add_request(rid, {"prompt_token_ids": prompt}, params)
                sent[rid] = {"prompt": prompt, "max_tokens": max_tokens, "arrival_iteration": step}
        if step == 9:
            engine.abort_request(["user-11"])
            sent["user-11"]["aborted"] = True
        for out in engine.step():
            if out.outputs:
                received[out.request_id] = list(out.outputs[0].token_ids)
        with open(out_path, "w") as fh:
            json.dump({"sent": sent, "received": received, "steps": step}, fh)
        if steps_limit is not None and step >= steps_limit:
            if "--slow" in sys.argv:
                time.sleep(600)  # the test kills us here
            break
        if step > 6 and not engine.has_unfinished_requests():
            break


def generate(llm: LLM, out_path: str) -> None:
    prompts = [[5 + i, 7, 9, 11 + i] * (1 + i % 3) for i in range(10)]
    params = [
        SamplingParams(max_tokens=4 + 2 * i, ignore_eos=True, temperature=0.0, detokenize=False) for i in range(10)
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    doc = {
        "sent": {o.request_id: {"prompt": p, "max_tokens": q.max_tokens} for o, p, q in zip(outputs, prompts, params)},
        "received": {o.request_id: list(o.outputs[0].token_ids) for o in outputs},
    }
    with open(out_path, "w") as fh:
        json.dump(doc, fh)


if __name__ == "__main__":
    main()
