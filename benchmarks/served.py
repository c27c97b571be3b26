"""Served throughput with the recorder off, on for the whole run, and windowed: side by side.

Where it sits: benchmarks, beside benchmarks/run.py (which runs it as the `served` figure).
Three real `vllm serve` processes (the tiny dummy-weight model, async scheduling, ngram_gpu
drafts, V1's runner: tests/live_serve.py's harness, run from the repository root) are started at
once, one per mode:

- `off`: specreplay installed, nothing asked of it (its plugin loads and returns);
- `whole`: `SPECREPLAY_RECORD=DIR`, every step written to part files;
- `window`: `SPECREPLAY_RECORD=DIR SPECREPLAY_WINDOW=2000`, the flight recorder.

Each round sends the same fixed batch (`vllm bench serve`: random prompts, ignore EOS, every
request its exact output length, all at once) to each server in turn, the order rotated every
round so that no mode always goes first; while one serves, the others are idle, and each batch
starts once every server is quiet (the tail of the batch before, a recorder writing it, is not
measured against the next). Per batch: output
tokens per second of wall time, and the CPU seconds the server's whole process tree (API server,
engine core, worker, their threads) spent per output token, read from /proc before and after.
Reported per mode: the median batch and the best (most tokens/s, least CPU per token), each
against `off`.

    python -m benchmarks.served [--rounds 15] [--prompts 128] [--output-len 128] [--json out.json]

Each server first runs WARMUP whole batches unmeasured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Any

MODES = ("off", "whole", "window")
WINDOW_STEPS = "2000"
WARMUP = 3


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` and every live descendant, threads included."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def settle(pids: list[int], quiet: float = 0.05, most_s: float = 60.0) -> None:
    """Wait until the servers' process trees are quiet: less than `quiet` of a core over half a
    second (a batch's tail: the engine finishing, a recorder's writer thread writing what the
    batch left, OpenMP threads spinning down), so no batch is measured beside another's tail."""
    import time

    deadline = time.monotonic() + most_s
    before = sum(tree_cpu_s(pid) for pid in pids)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = sum(tree_cpu_s(pid) for pid in pids)
        if now - before < quiet * 0.5:
            return
        before = now


def env_of(mode: str, folder: str) -> dict[str, str | None]:
    from specreplay.replay.families.vllm.attached import RECORD_ENV
    from specreplay.traces.window import WINDOW_ENV

    if mode == "off":
        return {RECORD_ENV: None, WINDOW_ENV: None}
    return {RECORD_ENV: os.path.join(folder, mode), WINDOW_ENV: WINDOW_STEPS if mode == "window" else None}


def measure(rounds: int, prompts: int, input_len: int, output_len: int) -> dict[str, Any]:
    from tests.live_serve import run_bench, start_server

    folder = tempfile.mkdtemp(prefix="specreplay-bench-served-")
    servers = {}
    try:
        for mode in MODES:
            # The harness's CPU patches in every mode (the V1 recipe), so the three servers run the
            # same engine; a recording server's plugin finds them applied.
            servers[mode] = start_server(env=env_of(mode, folder), workdir=tempfile.mkdtemp(prefix=f"serve-{mode}-"))
        for server in servers.values():
            server.wait_ready(timeout=600)
        # Warm-up: the first batches of a fresh server run slower (measured: a server's fourth
        # batch about twice its first's tokens/s here), so each runs WARMUP whole batches first.
        for w in range(WARMUP):
            for mode, server in servers.items():
                run_bench(
                    server, num_prompts=prompts, input_len=input_len, output_len=output_len, prefix=f"w{w}-{mode}-"
                )
        batches: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for r in range(rounds):
            order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
            for mode in order:
                server = servers[mode]
                settle([s.process.pid for s in servers.values()])
                cpu_before = tree_cpu_s(server.process.pid)
                run = run_bench(
                    server,
                    num_prompts=prompts,
                    request_rate=float("inf"),
                    input_len=input_len,
                    output_len=output_len,
                    seed=r,
                    prefix=f"r{r}-{mode}-",
                )
                cpu = tree_cpu_s(server.process.pid) - cpu_before
                tokens = sum(q.output_len for q in run.requests)
                if run.failed or tokens != prompts * output_len:
                    raise RuntimeError(f"{mode}: {run.failed} failed, {tokens} of {prompts * output_len} tokens")
                batches[mode].append({"tokens_per_s": tokens / run.duration_s, "cpu_s_per_token": cpu / tokens})
    finally:
        for server in servers.values():
            server.kill()
    # Medians, and the best batch of each mode: on a 2-core machine the client, the API server, the
    # engine core and the worker's OpenMP threads share the cores, and some batches of every mode
    # run at a third of the speed with three times the CPU per token (spinning threads); the best
    # batch is the one least disturbed, the median the typical one.
    per_mode = {
        mode: {
            "tokens_per_s": statistics.median(b["tokens_per_s"] for b in batches[mode]),
            "cpu_s_per_token": statistics.median(b["cpu_s_per_token"] for b in batches[mode]),
            "best_tokens_per_s": max(b["tokens_per_s"] for b in batches[mode]),
            "best_cpu_s_per_token": min(b["cpu_s_per_token"] for b in batches[mode]),
        }
        for mode in MODES
    }
    off = per_mode["off"]
    for mode in MODES:
        figures = per_mode[mode]
        figures["tokens_per_s_vs_off"] = figures["tokens_per_s"] / off["tokens_per_s"] - 1
        figures["cpu_per_token_vs_off"] = figures["cpu_s_per_token"] / off["cpu_s_per_token"] - 1
        figures["best_tokens_per_s_vs_off"] = figures["best_tokens_per_s"] / off["best_tokens_per_s"] - 1
        figures["best_cpu_per_token_vs_off"] = figures["best_cpu_s_per_token"] / off["best_cpu_s_per_token"] - 1
        figures["batches"] = batches[mode]
    return {
        "rounds": rounds,
        "prompts": prompts,
        "input_len": input_len,
        "output_len": output_len,
        "window_steps": int(WINDOW_STEPS),
        "modes": per_mode,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    result = measure(args.rounds, args.prompts, args.input_len, args.output_len)
    for mode, figures in result["modes"].items():
        print(
            f"{mode:>7}: median {figures['tokens_per_s']:7.1f} output tokens/s ({figures['tokens_per_s_vs_off']:+.1%} "
            f"vs off), {figures['cpu_s_per_token'] * 1e3:6.3f} ms server CPU per token "
            f"({figures['cpu_per_token_vs_off']:+.1%}); best {figures['best_tokens_per_s']:7.1f} tokens/s "
            f"({figures['best_tokens_per_s_vs_off']:+.1%}), {figures['best_cpu_s_per_token'] * 1e3:6.3f} ms "
            f"({figures['best_cpu_per_token_vs_off']:+.1%})"
        )
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(result, fh, indent=2)
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
