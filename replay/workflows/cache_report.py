"""What a trace says of vLLM's prefix cache: whether it was on, and how much it served.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli. `specreplay info` reads the config and a few columns, batch by batch
(the schema's sched_num_cached_tokens on each admission row, step_cache_evictions on every row of
a step); a trace written before prefix caching was modelled (schema < 8) ran without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class CacheCounts:
    """Admissions (new or resumed requests), those that hit the cache, the tokens they started
    with and the tokens the hits covered, and the cached blocks evicted, over a whole trace."""

    COLUMNS: ClassVar[tuple[str, ...]] = ("step", "sched_num_cached_tokens", "sched_num_tokens", "step_cache_evictions")

    enabled: bool | None  # None: the config does not say (a trace from before it was recorded: off)
    admissions: int = 0
    hits: int = 0
    tokens: int = 0
    cached_tokens: int = 0
    evictions: int = 0
    _steps: set[int] = field(default_factory=set)

    @classmethod
    def of_config(cls, config: dict[str, Any]) -> CacheCounts:
        return cls(config.get("enable_prefix_caching"))

    def add(self, batch: pa.RecordBatch) -> None:
        cached = batch.column("sched_num_cached_tokens")
        admitted = pc.is_valid(cached)
        self.admissions += pc.sum(admitted.cast(pa.int64())).as_py() or 0
        self.hits += pc.sum(pc.greater(pc.fill_null(cached, 0), 0).cast(pa.int64())).as_py() or 0
        self.cached_tokens += pc.sum(cached).as_py() or 0
        self.tokens += pc.sum(pc.filter(batch.column("sched_num_tokens"), admitted)).as_py() or 0
        steps = batch.column("step").to_numpy(zero_copy_only=False)
        evicted = batch.column("step_cache_evictions").to_pylist()
        for step, count in zip(steps.tolist(), evicted):
            if count is not None and step not in self._steps:
                self._steps.add(step)
                self.evictions += count

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": bool(self.enabled),
            "admissions": self.admissions,
            "hits": self.hits,
            "tokens": self.tokens,
            "cached_tokens": self.cached_tokens,
            "evictions": self.evictions,
        }

    def line(self) -> str:
        if not self.enabled:
            return "off" if self.enabled is False else "off (recorded before prefix caching was modelled)"
        return (
            f"on; {self.hits} of {self.admissions} admissions hit, {self.cached_tokens:,} of {self.tokens:,} "
            f"tokens from the cache; {self.evictions} cached blocks evicted"
        )
