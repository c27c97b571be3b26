"""One run of the attached-recorder overhead figure (benchmarks/run.py `attached`), in its own process.

    python -m benchmarks.attached_overhead REQUESTS MAX_TOKENS [v1|v2]

Builds a tiny dummy-weight vLLM engine in this process (async scheduling, ngram_gpu, k = 3)
on the runner asked for (v1: V1's GPUModelRunner, the default; v2: Model Runner V2, as a user
asks for it on a CPU: VLLM_USE_V2_MODEL_RUNNER=1, with Triton's interpreter on from the start)
with SPECREPLAY_RECORD set, so specreplay's plugin attaches the scheduler, input and worker
observers as it would to a user's engine; runs REQUESTS requests of MAX_TOKENS tokens; and
prints one JSON line: the thread CPU time spent inside the observers (every call the guard
makes: observers/guard.py) and inside the scheduler's own schedule() and update_from_output() (the
class methods, beneath the observers' wrappers), the CPU time of the part writer's background
thread (traces/parts.py: the JSON encoding and the writes, off the engine's thread, the last
flush at exit included), and the request-steps scheduled.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time


def main() -> None:
    requests, max_tokens = int(sys.argv[1]), int(sys.argv[2])
    runner = sys.argv[3] if len(sys.argv) > 3 else "v1"
    if runner == "v2":
        # What the user of an attached MRV2 recording sets: vLLM picks MRV2, and Triton's jit
        # functions are built under the interpreter (it must be on before Triton is imported).
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        os.environ["TRITON_INTERPRET"] = "1"
    folder = tempfile.mkdtemp(prefix="specreplay-bench-attached-")
    os.environ["SPECREPLAY_RECORD"] = folder
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

    from specreplay.replay.families.vllm.setup import engine_args
    from specreplay.replay.observers.guard import GUARD
    from specreplay.replay.workloads.config import EngineConfig
    from specreplay.traces.parts import flush_all
    from specreplay.traces.parts import writer_cpu_s as writer_cpu_s_of

    clock = time.thread_time
    spent = {"scheduler": 0.0, "recorder": 0.0, "request_steps": 0}

    def timed(method, key, count=False):
        def wrapper(self, *a, **kw):
            t0 = clock()
            result = method(self, *a, **kw)
            spent[key] += clock() - t0
            if count:
                spent["request_steps"] += len(result.num_scheduled_tokens)
            return result

        return wrapper

    # The scheduler's own work: the class methods the observers' instance wrappers call.
    Scheduler.schedule = timed(Scheduler.schedule, "scheduler", count=True)
    Scheduler.update_from_output = timed(Scheduler.update_from_output, "scheduler")
    guarded = GUARD.call

    def timed_call(who, fn, *args):
        t0 = clock()
        try:
            return guarded(who, fn, *args)
        finally:
            spent["recorder"] += clock() - t0

    GUARD.call = timed_call  # the observers look it up on the one GUARD when they attach or call

    k = 3
    config = EngineConfig(
        max_num_batched_tokens=requests * (1 + k),
        max_num_seqs=requests,
        num_spec_tokens=k,
        block_size=32,
        num_blocks=1 + requests * (-(-(16 + max_tokens + 2 * k) // 32)),
        max_model_len=16 + max_tokens + 2 * k + 32,
    )
    llm = LLM(**engine_args(config))  # async scheduling (the config's default), ngram_gpu, k = 3
    prompts = [{"prompt_token_ids": [(7 * i + j) % 400 + 3 for j in range(16)]} for i in range(requests)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False)
    llm.generate(prompts, params, use_tqdm=False)
    t0 = clock()
    flush_all()  # what is still queued, on this thread: the writer's cost too
    writer_cpu_s = writer_cpu_s_of() + clock() - t0
    print(
        json.dumps(
            {
                "scheduler_cpu_s": spent["scheduler"],
                "recorder_cpu_s": spent["recorder"],
                "writer_cpu_s": writer_cpu_s,
                "request_steps": spent["request_steps"],
                "runner": runner,
                "runner_class": ran_runner(folder),
            }
        )
    )


def ran_runner(folder: str) -> str | None:
    """The runner class the plugin found at the worker (its `ran` line in the sink): the figure
    is for the runner that ran, not the one asked for."""
    import glob

    for path in glob.glob(os.path.join(folder, "*.jsonl")):
        with open(path) as fh:
            for line in fh:
                if '"e":"ran"' in line.replace(" ", "") and '"runner"' in line:
                    return json.loads(line).get("runner")
    return None


if __name__ == "__main__":
    main()
