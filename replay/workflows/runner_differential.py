"""The runner differential: the reference runner against vLLM's real one, both driven by the oracle.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli. Each workload (the scenario set a live vLLM takes, then seeded
small workloads: workloads/fidelity_workloads.py `runner_workload`) runs twice on one runner
family (V1's GPUModelRunner or Model Runner V2):

- live (`--engine vllm`, in process), forced: the real scheduler and the real runner sample the
  oracle's tokens for what they feed and draft the workload's drafts (families/vllm/forced_logits.py);
- on the reference engine: the reference scheduler and reference runner of the same family, on the
  engine config that ran live, with the same oracle, stepped as the live driver steps vLLM
  (workloads/oracle.py `live_driven`).

Every scheduler and worker column the two traces share must be identical row for row
(check/tracediff.py); a difference is the reference parting from vLLM, named by its first step,
request and field. The scheduler differential (workflows/fidelity_sweep.py) already holds the
reference scheduler to the real one under one reference runner; this one holds the runner, and the
two sides' agreement, to vLLM's.

The live runs go to worker processes of their own (spawned): vLLM decides at import whether
Triton is present, and MRV2 on a CPU needs it while V1 crashes with it (families/vllm/mrv2/cpu_triton.py), so
a sweep's processes import vLLM for its runner whatever the calling process did. Each builds one
engine after another (about a second each, most of it vLLM's start; a step 10-100 ms).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreplay.traces.errors import InputError


@dataclass(frozen=True)
class RunnerCase:
    """One workload's comparison."""

    tag: str  # the scenario's name, or runner-<seed>
    same: bool
    first: str = ""  # the first difference: step, request, field, both values ("" when same)
    fields: tuple[str, ...] = ()  # the fields that differ anywhere
    features: frozenset[str] = frozenset()  # settings drawn and situations the run reached
    rows: int = 0
    refused: str = ""  # vLLM refused the config (not run)

    @property
    def differs(self) -> bool:
        return not self.same and not self.refused


@dataclass
class RunnerReport:
    runner: str
    impl: str
    seeds: tuple[int, int]  # first, count
    scenarios: tuple[str, ...]
    seconds: float = 0.0
    vllm_version: str = ""
    cases: list[RunnerCase] = field(default_factory=list)

    @property
    def differing(self) -> list[RunnerCase]:
        return [c for c in self.cases if c.differs]

    def coverage(self) -> dict[str, int]:
        from specreplay.replay.workflows.fidelity_sweep import coverage_of

        return coverage_of(self.cases)

    def summary(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "impl": self.impl,
            "vllm": self.vllm_version,
            "scenarios": list(self.scenarios),
            "seeds": [self.seeds[0], self.seeds[0] + self.seeds[1] - 1],
            "workloads": len(self.cases),
            "rows": sum(c.rows for c in self.cases),
            "identical": sum(c.same for c in self.cases),
            "refused": sum(bool(c.refused) for c in self.cases),
            "seconds": round(self.seconds, 1),
            "coverage": self.coverage(),
            "differing": [{"workload": c.tag, "first": c.first, "fields": list(c.fields)} for c in self.differing],
        }


def live_takes(workload: Any) -> bool:
    """What a live in-process vLLM takes: a KV cache that holds one request of max_model_len
    (its first block is the null block; vLLM refuses the engine otherwise) and no pause in wait
    mode (its in-process engine core refuses it: families/vllm/live.py refuse_undrivable)."""
    from specreplay.replay.families.vllm.live import cpu_attention_config

    config = cpu_attention_config(workload.config)
    waits = any(e.kind == "pause" and e.mode == "wait" for e in workload.events)
    return (config.num_blocks - 1) * config.block_size >= config.max_model_len and not waits


def differential_scenarios() -> tuple[str, ...]:
    """The scenario set's workloads a live in-process vLLM takes (all but `random`, drawn by seed)."""
    from specreplay.replay.workloads.scenarios import SCENARIOS, build_scenario

    return tuple(name for name in SCENARIOS if name != "random" and live_takes(build_scenario(name)))


def workload_of(tag: str) -> Any:
    """The workload a case names, a scenario or runner-<seed>, at the installed vLLM's release."""
    from specreplay.replay.families.vllm.setup import installed_vllm_version
    from specreplay.replay.workloads.fidelity_workloads import runner_workload
    from specreplay.replay.workloads.scenarios import build_scenario

    if tag.startswith("runner-"):
        workload = runner_workload(int(tag.removeprefix("runner-")))
    else:
        workload = build_scenario(tag)
    return workload.at_version(installed_vllm_version())


def compare_live(tag: str, runner: str, impl_name: str = "upstream", output_dir: str | None = None) -> RunnerCase:
    """Run one workload live and on the reference, both on `runner`, and diff them (module level:
    the worker processes import it). With `output_dir`: both traces, <tag>.vllm.parquet and
    <tag>.reference.parquet."""
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workflows.fidelity_sweep import features_of
    from specreplay.replay.workflows.replaying import trace_workload
    from specreplay.replay.workloads.oracle import live_driven

    impl = resolve(impl_name, allow_import=True)
    workload = workload_of(tag)
    try:
        live = run_workload(workload, impl, engine="vllm", runner=runner)
    except InputError as exc:
        if "vllm rejects" not in str(exc):
            raise  # the workload or the setup is bad: not a finding about the reference
        return RunnerCase(tag, False, refused=str(exc))
    ran = trace_workload(live, tag)  # the config the live engine ran (a CPU rounds block sizes up)
    reference = run_workload(ran, impl, engine="reference", runner=runner, oracle=live_driven(ran))
    if output_dir is not None:
        from specreplay.traces.io import write_trace

        write_trace(live, Path(output_dir) / f"{tag}.vllm.parquet")
        write_trace(reference, Path(output_dir) / f"{tag}.reference.parquet")
    diff = diff_traces(reference, live)
    first = diff.first
    text = "" if first is None else f"step {first.step}, request {first.request_id!r}: {first.message}"
    features = features_of(ran, reference) | {f"runner {live.impl.runner_family}"}
    return RunnerCase(tag, diff.same, text, tuple(sorted(diff.fields)), features, live.table.num_rows)


def _compare_in_worker(args: tuple[str, str, str, str | None]) -> RunnerCase:
    import os

    from specreplay.replay.families.vllm import forced_logits

    os.environ.pop(forced_logits.UNFORCED_ENV, None)  # the differential is of forced runs
    with _heap_kept_frozen():
        return compare_live(*args)


@contextmanager
def _one_thread_each() -> Iterator[None]:
    """The worker processes (spawned meanwhile: they inherit it) run one OpenMP thread each, unless
    OMP_NUM_THREADS says otherwise: the engines are tiny, and vLLM's CPU worker binds a thread to
    every core, so processes side by side (--jobs, or beside other work) oversubscribe the cores
    and spin: 42 s against 6 s for two processes of 12 small V1 workloads each, here."""
    import os

    before = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)


@contextmanager
def _heap_kept_frozen() -> Iterator[None]:
    """A worker process builds one engine after another, and each start and shutdown of vLLM's
    collects the whole heap several times (its shutdown unfreezes what its start froze): about
    1 s an engine here, half of a small workload's cost. In these processes the interpreter's
    long-lived objects (torch, vLLM, Triton) stay frozen: each collection then scans only what
    the engine made since, and still frees all of it (the live run collects after each engine,
    before freezing again). Memory management only: what the engines compute is unchanged."""
    import gc

    unfreeze = gc.unfreeze
    gc.unfreeze = lambda: None  # type: ignore[assignment]
    try:
        yield
    finally:
        gc.unfreeze = unfreeze  # type: ignore[assignment]


def runner_differential(
    runner: str,
    impl_name: str = "upstream",
    start: int = 0,
    count: int = 100,
    scenarios: bool = True,
    jobs: int = 1,
    output_dir: Path | None = None,
    progress: Callable[[int, RunnerCase], None] | None = None,
) -> RunnerReport:
    """Compare the scenario set (with `scenarios`) and seeds start .. start + count - 1 on
    `runner`, in `jobs` spawned processes; cases come back in order. With `output_dir`: both
    traces of every workload and runner-differential.json."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from specreplay.replay.engines.registry import runner_family
    from specreplay.replay.families.vllm.setup import load_vllm
    from specreplay.replay.impls.registry import resolve

    family = runner_family(runner).name  # a bad name fails here, once
    vllm = load_vllm("specreplay fidelity --runner")  # no vLLM: one line on how to install it
    resolve(impl_name, allow_import=True)
    names = differential_scenarios() if scenarios else ()
    tags = [*names, *(f"runner-{s}" for s in range(start, start + count))]
    report = RunnerReport(family, impl_name, (start, count), names, vllm_version=vllm.__version__)
    where = None
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
        where = str(output_dir)
    began = time.perf_counter()
    work = [(tag, family, impl_name, where) for tag in tags]
    with _one_thread_each(), ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for case in pool.map(_compare_in_worker, work, chunksize=max(1, len(work) // (4 * jobs))):
            report.cases.append(case)
            if progress is not None:
                progress(len(report.cases), case)
    report.seconds = time.perf_counter() - began
    if output_dir is not None:
        (output_dir / "runner-differential.json").write_text(json.dumps(report.summary(), indent=1) + "\n")
    return report


__all__ = [
    "RunnerCase",
    "RunnerReport",
    "compare_live",
    "differential_scenarios",
    "live_takes",
    "runner_differential",
    "workload_of",
]
