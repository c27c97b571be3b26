"""The engine loop: schedule, execute, apply, record both views, with one or two batches in flight.

Where it sits: **record** -> traces -> replay -> diff. `run_workload` drives an implementation
through a workload exactly in the order of vLLM's `step_with_batch_queue` (reference section 2):
schedule(m), execute + sample(m) on the worker, then pop the oldest batch, apply aborts, and
`update_from_output` it. With async scheduling the queue holds two batches, so schedule(m)
sees the outputs of steps <= m-2 only; in sync mode it holds one and drafts flow back through
`update_draft_token_ids`.
"""

from __future__ import annotations

import platform
import time
from collections import defaultdict, deque
from typing import Callable

from specreplay.replay.impls import Implementation
from specreplay.replay.messages import EngineCrash
from specreplay.replay.oracle import Oracle
from specreplay.replay.recorder import Recorder
from specreplay.replay.request import Request
from specreplay.replay.workload import Workload
from specreplay.traces.errors import InputError
from specreplay.traces.trace import Trace

ProgressFn = Callable[[int, int], None]  # (steps done, max steps)


def run_workload(workload: Workload, impl: Implementation, device: str = "cpu",
                 progress: ProgressFn | None = None, engine: str = "reference") -> Trace:
    """Run `workload` through `impl` and return the recorded trace. An exception raised inside
    outside code (a `module:attr` implementation) becomes one InputError line naming it."""
    if not impl.user_code:
        return _run(workload, impl, device, progress, engine)
    try:
        return _run(workload, impl, device, progress, engine)
    except InputError:
        raise
    except Exception as exc:  # the user's scheduler or runner failed: say where, no traceback
        raise InputError(f"implementation {impl.name} raised {type(exc).__name__}: {exc}") from None


def _run(workload: Workload, impl: Implementation, device: str, progress: ProgressFn | None,
         engine: str) -> Trace:

    config = workload.config
    oracle = Oracle(workload)
    sched = impl.make_scheduler(config, engine)
    runner = impl.make_runner(config, oracle, device)
    rec = Recorder(oracle)
    arrivals: dict[int, list] = defaultdict(list)
    for order, spec in enumerate(workload.requests):
        arrivals[spec.arrival_step].append((order, spec))
    aborts = sorted((spec.abort_step, spec.request_id) for spec in workload.requests if spec.abort_step)
    queue: deque = deque()
    outcome: dict = {"status": "completed"}
    step = 0
    try:
        while True:
            for order, spec in arrivals.pop(step + 1, ()):
                req = Request(spec.request_id, oracle.prompt(spec.request_id), spec.max_tokens,
                              oracle.stop_token(spec.request_id), order)
                rec.add_request(sched.add_request(req))
            if not sched.has_requests() and not queue:
                if not arrivals:
                    break
                step = min(arrivals) - 1  # idle engine: nothing to schedule until the next arrival
                continue
            if sched.has_requests():
                step += 1
                sched.step = step - 1  # the engine numbers steps (idle gaps included); schedule() adds 1
                rec.snapshot(sched)
                out = sched.schedule()
                rec.record_schedule(out, sched)
                delivered = impl.deliver(out)
                result = runner.execute_model(delivered)
                if delivered is out and hasattr(sched, "share_edits"):
                    sched.share_edits(out)  # the real scheduler reads back what the worker edited
                rec.record_worker(step, runner.view)
                queue.appendleft((out, result))
                if progress is not None:
                    progress(step, workload.max_steps)
                # Keep a batch in flight: async returns here until the queue holds two batches.
                if out.total_num_scheduled_tokens > 0 and len(queue) < config.depth:
                    continue
            while aborts and aborts[0][0] <= step:
                for rid in sched.finish_requests([aborts.pop(0)[1]]):
                    rec.record_abort(step, rid)
            done, result = queue.pop()
            reports = sched.update_from_output(done, result)
            rec.record_apply(done.step, reports, step)
            if not sched.is_async and config.num_spec_tokens:
                sched.update_draft_token_ids(*runner.take_draft_token_ids())
            if step >= workload.max_steps:
                outcome = {"status": "step_limit", "step": step}
                break
    except EngineCrash as exc:  # an assert in the scheduler, or the worker unable to run a step
        outcome = {"status": "crashed", "step": step, "kind": exc.kind, "message": str(exc)}
    return Trace(
        table=rec.table(),
        workload=workload.to_dict(),
        config=config.to_dict(),
        impl=impl.describe(sched, engine),
        outcome=outcome,
        seed=workload.seed,
        device=device,
        volatile={"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "host": platform.node(), "python": platform.python_version()},
    )
