"""Fidelity: the reference scheduler against the installed vLLM's real scheduler, seed by seed.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli. Each seed's fidelity workload (workloads/fidelity_workloads.py) runs
twice with the same implementation and the same reference runner: on `--engine reference` and on
`--engine vllm-scheduler`. The two traces must be identical row for row, column for column
(check/tracediff.py); any difference is the reference model parting from vLLM, named by its first
step, request and field. What comes back from a seed is small (same or not, the first difference,
the situations the run reached); the traces of a differing seed are re-made in this process,
deterministically, when they are to be saved.

`fidelity_to` runs a sweep and, for each differing seed, leaves in its folder the workload
(JSON, for `specreplay record --workload`) and both traces (for `specreplay diff A B`).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreplay.replay.engines import registry
from specreplay.traces.errors import InputError


def compared_engines() -> tuple[str, ...]:
    """The engines a seed runs on: those driving a scheduler in specreplay's loop with the same
    reference runner (the reference models first, then vLLM's real scheduler)."""
    return registry.loop_engines()


@dataclass(frozen=True)
class FidelityCase:
    """One seed's comparison."""

    seed: int
    same: bool
    first: str = ""  # the first difference: step, request, field, both values ("" when same)
    fields: tuple[str, ...] = ()  # the fields that differ anywhere
    features: frozenset[str] = frozenset()  # situations the reference run reached
    rejected: str = ""  # one engine refused the workload: the other accepted what vLLM rejects
    not_applicable: str = ""  # the implementation does not apply to this seed's workload: nothing ran

    @property
    def differs(self) -> bool:
        return not self.same and not self.not_applicable


@dataclass
class FidelityReport:
    impl: str
    start: int
    count: int
    seconds: float = 0.0
    vllm_version: str = ""
    cases: list[FidelityCase] = field(default_factory=list)

    @property
    def differing(self) -> list[FidelityCase]:
        return [c for c in self.cases if c.differs]

    def coverage(self) -> dict[str, int]:
        """Situation -> seeds that reached it, in a stable order."""
        return coverage_of(self.cases)

    def summary(self) -> dict[str, Any]:
        return {
            "impl": self.impl,
            "vllm": self.vllm_version,
            "seeds": [self.start, self.start + self.count - 1],
            "workloads": len(self.cases),
            "identical": sum(c.same for c in self.cases),
            "not_applicable": sum(bool(c.not_applicable) for c in self.cases),
            "seconds": round(self.seconds, 1),
            "coverage": self.coverage(),
            "differing": [
                {"seed": c.seed, "first": c.first, "fields": list(c.fields), "rejected": c.rejected}
                for c in self.differing
            ],
        }


def compare_seed(impl_name: str, seed: int) -> FidelityCase:
    """Run one seed on both engines (module level: process pools import it)."""
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.families.vllm.setup import installed_vllm_version
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.fidelity_workloads import fidelity_workload

    impl = resolve(impl_name, allow_import=True)
    workload = fidelity_workload(seed).at_version(installed_vllm_version())
    reason = impl.why_not(workload.config)
    if reason:  # e.g. an AsyncScheduler variant on a synchronous seed: counted apart, never run as another
        return FidelityCase(seed, False, not_applicable=reason)
    traces = []
    for engine in compared_engines():
        try:
            traces.append(run_workload(workload, impl, engine=engine))
        except InputError as exc:
            if not registry.engine(engine).stops_on(exc):
                raise  # the workload or the setup is bad: not a finding about the reference
            return FidelityCase(seed, False, f"vLLM rejects a config the reference accepts: {exc}", rejected=str(exc))
    diff = diff_traces(traces[0], traces[1])
    first = diff.first
    text = "" if first is None else f"step {first.step}, request {first.request_id!r}: {first.message}"
    return FidelityCase(seed, diff.same, text, tuple(sorted(diff.fields)), features_of(workload, traces[0]))


def features_of(workload: Any, trace: Any) -> frozenset[str]:
    """The settings a workload drew and the situations its reference run reached."""
    config = workload.config
    k, lookahead = config.num_spec_tokens, config.num_lookahead_tokens
    seen = {
        "async" if config.async_scheduling else "sync",
        f"k={k}",
        f"block_size={config.block_size}",
        "lookahead=0" if lookahead == 0 else ("lookahead=k" if lookahead == k else "lookahead=1..k-1"),
    }
    if config.long_prefill_token_threshold:
        seen.add("long-prefill threshold")
    if not config.enable_prefix_caching:
        seen.add("prefix caching off")
    if config.eagle_block_drop:
        seen.add("eagle block drop")
    if workload.prefixes or any(r.follows for r in workload.requests):
        seen.add("shared prompts")
    if config.max_num_seqs == 1:
        seen.add("max_num_seqs=1")
    if config.max_num_seqs >= 32:
        seen.add("max_num_seqs>=32")
    if any(workload.prompt_len_of(r.request_id) == 1 for r in workload.requests):
        seen.add("1-token prompt")
    if len({r.arrival_step for r in workload.requests}) > 1:
        seen.add("arrivals over time")
    for event in workload.events:
        seen.add(f"event {event.kind}")
    df = trace.table.to_pandas()
    decoding = (df.sched_num_scheduled_tokens > 0) & ~df.sched_is_prefill_chunk & (df.sched_num_computed_tokens > 0)
    cut = decoding & (df.sched_num_draft_slots < k)  # fewer than k draft slots booked
    at_the_end = df.sched_num_computed_tokens + df.sched_num_scheduled_tokens >= config.max_model_len - 1
    budget_spent = df.step_total_scheduled_tokens == config.max_num_batched_tokens
    situations = {
        "preemption": df.sched_preempted.any(),
        "chunked prefill": df.sched_is_prefill_chunk.any(),
        "budget skip": (df.sched_skip == "budget").any(),
        "re-entry": (df.sched_kind == "reentering").any(),
        "abort": (df.apply_finish_reason == "aborted").any(),
        "stop": (df.apply_finish_reason == "stop").any(),
        "max_tokens finish": (df.apply_finish_reason == "length").any(),
        "drafts cut by max_model_len": bool(k and (cut & at_the_end).any()),
        "drafts cut by the budget": bool(k and (cut & budget_spent).any()),
        "stale output": (df.apply_outcome == "stale_delivered").any(),
        "dropped output": (df.apply_outcome == "dropped").any(),
        "prefix-cache hit": (df.sched_num_cached_tokens.fillna(0) > 0).any(),
        "cache eviction": (df.step_cache_evictions.fillna(0) > 0).any(),
    }
    seen.update(name for name, hit in situations.items() if hit)
    seen.add(f"outcome {trace.outcome.status}")
    return frozenset(seen)


def fidelity_sweep(
    impl_name: str = "upstream",
    start: int = 0,
    count: int = 300,
    jobs: int = 1,
    progress: Callable[[int, FidelityCase], None] | None = None,
) -> FidelityReport:
    """Compare seeds start .. start + count - 1, in `jobs` processes; cases come back in seed order."""
    from specreplay.replay.families.vllm.setup import load_vllm

    vllm = load_vllm("specreplay fidelity")  # no vLLM: one line on how to install it, before any work
    from specreplay.replay.impls.registry import resolve

    resolve(impl_name, allow_import=True)  # a bad name fails here, once
    report = FidelityReport(impl_name, start, count, vllm_version=vllm.__version__)
    began = time.perf_counter()
    seeds = range(start, start + count)
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = pool.map(compare_seed, [impl_name] * count, seeds, chunksize=4)
            _gather(report, results, progress)
    else:
        _gather(report, (compare_seed(impl_name, s) for s in seeds), progress)
    report.seconds = time.perf_counter() - began
    return report


def _gather(report: FidelityReport, results: Any, progress: Callable | None) -> None:
    for case in results:
        report.cases.append(case)
        if progress is not None:
            progress(len(report.cases), case)


def fidelity_to(output_dir: Path | None, impl_name: str = "upstream", **sweep: Any) -> FidelityReport:
    """A sweep; with `output_dir`, fidelity.json and each differing seed's workload and traces."""
    report = fidelity_sweep(impl_name, **sweep)
    if output_dir is None:
        return report
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.families.vllm.setup import installed_vllm_version
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.fidelity_workloads import fidelity_workload
    from specreplay.traces.io import write_trace

    output_dir.mkdir(parents=True, exist_ok=True)
    impl = resolve(impl_name, allow_import=True)
    summary = report.summary()
    for entry, case in zip(summary["differing"], report.differing, strict=True):
        workload = fidelity_workload(case.seed).at_version(installed_vllm_version())
        name = f"fidelity-{case.seed}"
        (output_dir / f"{name}.json").write_text(json.dumps(workload.to_dict()) + "\n")
        entry["workload"] = f"{name}.json"
        if case.rejected:
            continue
        for engine in compared_engines():
            write_trace(run_workload(workload, impl, engine=engine), output_dir / f"{name}.{engine}.parquet")
        entry["traces"] = [f"{name}.{engine}.parquet" for engine in compared_engines()]
    (output_dir / "fidelity.json").write_text(json.dumps(summary, indent=1) + "\n")
    return report


def coverage_of(cases: Any) -> dict[str, int]:
    """Setting or situation -> the cases (each with `features`) that reached it, settings first."""
    counts = Counter(f for c in cases for f in c.features)
    return dict(sorted(counts.items(), key=_feature_order))


#: Coverage lists settings first (in this order), then situations, then events, then outcomes.
_SETTINGS = ("async", "sync", "k=", "lookahead", "block_size", "max_num_seqs", "long-prefill", "1-token", "arrivals")


def _feature_order(item: tuple[str, int]) -> tuple[int, list]:
    name = item[0]
    rank = next((i for i, p in enumerate(_SETTINGS) if name.startswith(p)), None)
    if rank is None:
        rank = len(_SETTINGS) + name.startswith("event") + 2 * name.startswith("outcome")
    return rank, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


__all__ = [
    "FidelityCase",
    "FidelityReport",
    "compare_seed",
    "coverage_of",
    "features_of",
    "fidelity_sweep",
    "fidelity_to",
]
