"""The scheduler serving Model Runner V2: specreplay's reference scheduler and the installed vLLM's
real one, each driving the reference MRV2 (`--runner v2`), give the same trace row for row.

Under `use_v2_model_runner` vLLM's scheduler sends a request resumed from preemption as a new one
with all its tokens as prefill and keeps no MRV1 re-entry list (scheduler.py ~1418, ~1731); the
reference scheduler models the same flag (models/scheduler.py). The workloads: the seed's
re-entry, and `random` seeds with preemption (the first eight that preempt) and without. Marked
`vllm` (vLLM's scheduler is imported; no engine starts). Measured by hand over the first 60
`random` seeds and two hand-written workloads: 62 of 62 identical, 33 of them with preemption.
"""

from __future__ import annotations

import pytest

from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario

pytestmark = pytest.mark.vllm

PREEMPTING = [0, 1, 2, 3, 4, 11, 12, 13]  # random seeds whose v2 run preempts
CASES = [("reentry", 0), ("reentry-sync", 0)] + [("random", s) for s in PREEMPTING + [5, 6]]


@pytest.mark.parametrize("name, seed", CASES)
def test_the_reference_and_the_real_scheduler_agree_serving_mrv2(name, seed):
    workload = build_scenario(name, seed)
    impl = resolve("upstream", allow_import=False)
    reference = run_workload(workload, impl, runner="v2")
    real = run_workload(workload, impl, engine="vllm-scheduler", runner="v2")
    assert real.impl.runner_family == "v2" and real.impl.engine == "vllm-scheduler"
    diff = diff_traces(reference, real)
    assert diff.same, diff.first
    if seed in PREEMPTING and name == "random":
        rows = reference.table.to_pylist()
        freed = [(r["step"], r["request_id"]) for r in rows if r["worker_freed_preempted"]]
        assert freed
        back = {(r["step"], r["request_id"]) for r in rows if r["worker_new_life"]}
        for step, rid in freed:  # each preempted request's next life is a new one (unless it never ran again)
            later = [s for s, r in back if r == rid and s >= step]  # back at once, or later
            ran_later = any(r["request_id"] == rid and r["step"] >= step and r["worker_slot"] is not None for r in rows)
            assert later or not ran_later, (step, rid)
