"""The end of a live run: the engine core announces its last finished requests and applies the
batch still in flight, as vLLM's own busy loop does, and the reference engine steps the same.

The workload (3 requests, async, k = 2, budget 64, 5 KV blocks of 32, max_model_len 64): q0, the
last to finish, reaches max_tokens when step 4's output is applied at step 5, while step 5 (which
booked q0 again: the max-tokens rule cannot skip it, a draft may be rejected) is in flight. vLLM's
has_requests() counts the finished q0 until a schedule() announces it (scheduler.py:2813-2833), so
the engine core schedules step 6, empty, and that iteration pops step 5's batch (core.py:724-768):
q0's step-5 output is applied (ignored) at step 6, next to step 6's announce row. EngineCoreProc
does that on its own (has_work, core.py:1534); the in-process driver used to do it only while an
input was still due (here a late abort of q1, long finished: a no-op), and the reference never
announced a request finishing while nothing else was unfinished: its trace ended a step earlier,
with step 5's batch applied "at step 5". On either runner, with and without the late abort, the
live recording and `record --engine reference` must now be the same trace, row for row.

Marked `vllm`; V1 on this file's worker, MRV2 grouped "mrv2" (families/vllm/mrv2/cpu_triton.py: a process
imports vLLM for one runner). Engines started: two per runner (about 15 s each on V1, 30 s on MRV2).
"""

from __future__ import annotations

import pytest

from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import Event, RequestSpec, Workload

pytestmark = pytest.mark.vllm

CONFIG = EngineConfig(
    max_num_batched_tokens=64,
    num_spec_tokens=2,
    async_scheduling=True,
    block_size=32,
    num_blocks=5,  # block 0 is the null block, in vLLM as in the reference: 4 usable, 128 tokens
    max_model_len=64,
    num_lookahead_tokens=2,  # what the live engine's draft model reserves: the config that runs
)
LATE_ABORT = Event(step=30, kind="abort", request="q1", when="after")  # q1 finished at step 4: a no-op


def late_abort_workload(late_abort: bool) -> Workload:
    requests = (
        RequestSpec("q0", arrival_step=2, prompt_len=1, max_tokens=5),
        RequestSpec("q1", arrival_step=3, prompt_len=48, max_tokens=1),
        RequestSpec("q2", arrival_step=1, prompt_len=15, max_tokens=2),
    )
    return Workload(
        requests,
        CONFIG,
        name="late-abort" if late_abort else "no-late-abort",
        seed=1,
        acceptance="alternate",
        max_steps=200,
        events=(LATE_ABORT,) if late_abort else (),
    )


def record(runner: str) -> dict[bool, tuple]:
    """Both workloads, live (forced, in process) and on the reference engine as `specreplay
    record --workload` runs it."""
    impl = resolve("upstream", allow_import=False)
    traces = {}
    for late_abort in (True, False):
        workload = late_abort_workload(late_abort)
        live = run_workload(workload, impl, engine="vllm", runner=runner)
        reference = run_workload(workload, impl, runner=runner)
        traces[late_abort] = (live, reference)
    return traces


@pytest.fixture(scope="module")
def v1():
    return record("v1")


@pytest.fixture(scope="module")
def v2():
    return record("v2")


def holds(traces: dict[bool, tuple], runner: str) -> None:
    for late_abort, (live, reference) in traces.items():
        assert live.impl.runner_family == runner
        assert live.outcome.status == "completed" and not live.outcome.unfinished, live.outcome
        assert live.config.to_dict() == reference.config.to_dict()  # what ran live is the workload's config
        diff = diff_traces(live, reference)
        first = diff.first
        assert diff.same, (late_abort, f"step {first.step}, request {first.request_id}: {first.message}")
        df = live.table.to_pandas()
        q0 = df[df.request_id == "q0"].set_index("step")
        # Step 5 booked q0 again; its output is applied (ignored: q0 finished at step 5) when
        # step 6's announcing schedule pops the batch, and step 6 is that announcement.
        assert (q0.loc[5, "apply_step"], q0.loc[5, "apply_outcome"]) == (6, "ignored"), q0
        assert q0.loc[6, "sched_status"] == "finished" and bool(q0.loc[6, "sched_finished_announced"])
        assert int(df.step.max()) == 6
    # The late abort (of a request finished long before) changes nothing the engine did.
    with_abort, without = traces[True][0], traces[False][0]
    diff = diff_traces(with_abort, without)
    assert diff.same, f"step {diff.first.step}, request {diff.first.request_id}: {diff.first.message}"


def test_the_live_tail_is_the_references_on_v1(v1):
    holds(v1, "v1")


@pytest.mark.xdist_group("mrv2")
def test_the_live_tail_is_the_references_on_mrv2(v2):
    holds(v2, "v2")
