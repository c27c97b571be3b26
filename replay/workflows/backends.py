"""Where explore's candidates run: inline, in a pool of local processes, or on a Ray cluster.

Where it sits: workflows, under explore. A backend runs a batch of candidates and returns their
results in candidate order, so the search finds the same whatever runs it; each candidate runs
`explore.run_candidate`, a module-level function that process pools and Ray workers import.
"""

from __future__ import annotations

from specreplay.replay.workflows.explore import Candidate, CaseResult, run_candidate
from specreplay.traces.errors import InputError


class InlineBackend:
    """In this process, one candidate after another."""

    def run(self, impl: str, engine: str, batch: list[Candidate]) -> list[CaseResult]:
        return [run_candidate(impl, engine, c) for c in batch]

    def close(self) -> None:
        pass


class ProcessBackend:
    """`--jobs N`: a pool of local processes, kept across generations."""

    def __init__(self, jobs: int) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self.pool = ProcessPoolExecutor(max_workers=jobs)

    def run(self, impl: str, engine: str, batch: list[Candidate]) -> list[CaseResult]:
        return list(self.pool.map(run_candidate, [impl] * len(batch), [engine] * len(batch), batch))

    def close(self) -> None:
        self.pool.shutdown()


class RayBackend:
    """`--ray ADDRESS`: candidates as Ray tasks ('local' starts a one-machine cluster)."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise InputError("--ray needs Ray: pip install 'specreplay[ray]'") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            ray.init(
                address=None if address == "local" else address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        self.task = ray.remote(run_candidate)

    def run(self, impl: str, engine: str, batch: list[Candidate]) -> list[CaseResult]:
        return self.ray.get([self.task.remote(impl, engine, c) for c in batch])  # in submission order

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


Backend = InlineBackend | ProcessBackend | RayBackend


def make_backend(jobs: int = 1, ray_address: str | None = None) -> Backend:
    """Ray at `ray_address`, else `jobs` local processes, else inline."""
    if ray_address and jobs > 1:
        raise InputError("give --jobs or --ray, not both")
    if ray_address:
        return RayBackend(ray_address)
    return ProcessBackend(jobs) if jobs > 1 else InlineBackend()
