"""`--engine sglang-scheduler`: SGLang 0.5.23's own event loop over a workload, both views recorded.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. `run_sglang` builds SGLang's real Scheduler with the reference SGLang
worker (families/sglang/setup.py, families/sglang/workers.py), attaches the SGLang observer and the
KV truth, and calls `Scheduler.run_event_loop()`: SGLang's `dispatch_event_loop` picks
`event_loop_overlap` or `event_loop_normal`, which run unchanged. No loop body is copied: a copy
that missed one flag (`enable_skip_finishing_decode`, the result queue, `is_disable_overlap_for_batch`,
`launch_batch_sample_if_needed`, the busy-time invariant check) would silently change what the
real scheduler does. The driver holds to SGLang's loops by feeding them from their one input seam:

- every iteration starts with `ingest_requests()`, whose `self.request_receiver.recv_requests()`
  (scheduler.py:2205) the `ScriptedReceiver` answers (SGLang's receiver is a frozen dataclass:
  replaced, not patched). Its call count is the trace's step. It hands in the workload's arrivals
  due at that step (TokenizedGenerateReqInput, sampling parameters normalized as SGLang's
  TokenizerManager does) and its aborts (AbortReq): an `[[events]]` abort at step m, and an
  `abort_step` / `when = "after"` abort of step m (vLLM: after step m's schedule, before its
  apply) at step m + 1, SGLang's first input point after step m's schedule;
- once nothing more is due and the scheduler is fully idle (`is_fully_idle()`: no running,
  waiting or chunked request, no batch in flight), it hands in SGLang's own `ShutdownReq`: the
  rest of that iteration runs (so `on_idle` runs SGLang's idle leak checks on the final state)
  and the loop ends at its top;
- a workload still running after its `max_steps` iterations ends the run with outcome
  `step_limit` (the receiver raises; the scheduler is closed).

What the scheduler sends its client (zmq sockets nobody reads here) is kept instead: the token
ids each client received, and their counts, go into the outcome (`engine_output_ids`,
`engine_output_tokens`). An exception SGLang's
code or the reference worker raises ends the run as an engine crash at that step (SGLang's own
invariant checks assert: families/sglang/setup.py CHECKS); one of specreplay's own propagates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import tempfile
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specreplay.replay.engines.crash import crash_outcome
from specreplay.replay.engines.events import Abort, StreamAppend
from specreplay.replay.engines.inputs import InputDriver
from specreplay.replay.engines.outcome import run_outcome
from specreplay.replay.engines.run_request import ProgressFn
from specreplay.replay.families.sglang import setup as sglang_setup
from specreplay.replay.families.sglang.observer import SglangObserver, attach
from specreplay.replay.families.sglang.sessions import SessionClient
from specreplay.replay.families.sglang.truth import SglangTruth
from specreplay.replay.families.sglang.worker import SglangReferenceWorker
from specreplay.replay.impls.registry import Implementation
from specreplay.replay.observers.recorder import FLUSH_EVERY, Recorder
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError
from specreplay.traces.journal import JournalWriter
from specreplay.traces.trace import Trace


class StepLimit(Exception):
    """The workload's max_steps iterations ran out (raised out of recv_requests)."""


class ScriptedReceiver:
    """Stands in for `Scheduler.request_receiver` (module docstring)."""

    def __init__(
        self,
        scheduler: Any,
        workload: Workload,
        oracle: Oracle,
        observer: SglangObserver,
        progress: ProgressFn | None,
        recorder: Recorder | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.inputs = InputDriver(workload, oracle)
        self.observer = observer
        self.progress = progress
        self.recorder = recorder  # its settled rows go to the run's journal as the iterations pass
        self.sessions = SessionClient(self.inputs, self.generate)
        self.max_steps = workload.max_steps
        self.iteration = 0

    def recv_limit_reached(self, num_recv_reqs: int) -> bool:  # the real receiver's other method
        return False

    def recv_requests(self, local_reqs: Any = None) -> list[Any]:
        from sglang.srt.managers.io_struct import AbortReq, ShutdownReq

        self.iteration += 1
        step = self.iteration
        if step > self.max_steps:
            self.iteration = self.max_steps
            raise StepLimit
        self.observer.set_iteration(step)
        if self.recorder is not None:
            self.recorder.maybe_flush(step)
        if self.progress is not None:
            self.progress(step, self.max_steps)
        inputs, sessions = self.inputs, self.sessions
        due: list[Any] = []
        for spec in inputs.pop_arrivals(step):
            request = self.tokenized(spec)
            due += sessions.first_turn(spec, request) if spec.streaming else [request]
        aborts = []
        for event in inputs.pop_events(step):
            if isinstance(event, Abort):
                aborts.append(event.request)
            elif isinstance(event, StreamAppend):
                sessions.chunk_arrived(event.request)
        aborts += inputs.pop_aborts(step - 1)
        due += sessions.due()  # the turns held for their session's last turn to end; the closes
        for rid in aborts:
            due.append(AbortReq(rid=rid))
            sessions.aborted(rid)
        due += list(local_reqs or [])
        pending = inputs.arrivals or inputs.events or inputs.aborts or sessions.active
        if not due and not pending and self.scheduler.is_fully_idle():
            due.append(ShutdownReq())
        return due

    def tokenized(self, spec: Any) -> Any:
        """A workload request as SGLang's TokenizerManager hands it on: greedy, its prompt ids,
        its stop token (ignore_eos off: the tiny model has no EOS id, families/sglang/setup.py),
        streamed (a client that reads each token as it comes: the output streamer sends every
        iteration's new ids). An `input_embeds` request sends one embedding row per prompt
        position, standing for its token (`setup.embedding_rows`), and no ids: SGLang makes up
        placeholder ids itself, and the reference worker reads the rows."""
        prompt, max_tokens, stop = self.inputs.submit(spec)
        embeds = sglang_setup.embedding_rows(prompt) if spec.input_embeds else None
        return self.generate(spec.request_id, prompt, max_tokens, stop, embeds)

    def generate(
        self, rid: str, prompt: list[int], max_tokens: int, stop: int | None = None, embeds: Any = None
    ) -> Any:
        """The TokenizedGenerateReqInput of `tokenized`: a request, or a streaming session's turn
        (families/sglang/sessions.py names its session)."""
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(
            max_new_tokens=max_tokens,
            stop_token_ids=None if stop is None else {stop},
            temperature=0.0,
            ignore_eos=False,
        )
        params.normalize(None)  # what TokenizerManager does (unnormalized, the stop checks read len(None))
        return TokenizedGenerateReqInput(
            rid=rid,
            input_text=None,
            input_ids=None if embeds is not None else array("q", prompt),
            input_embeds=embeds,
            mm_inputs=None,
            token_type_ids=None,
            sampling_params=params,
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=True,
        )


class KvView:
    """What the KV truth reads (families/sglang/truth.py): the scheduler's request rows, the
    allocator's free slots, and the reference worker's KV buffer."""

    def __init__(self, scheduler: Any, worker: SglangReferenceWorker) -> None:
        self.table = scheduler.req_to_token_pool.req_to_token
        self.allocator = scheduler.token_to_kv_pool_allocator
        self.worker = worker

    def row_slots(self, req_pool_idx: int, length: int) -> list[int]:
        return self.table[req_pool_idx, :length].tolist()

    def free(self, slots: list[int]) -> list[bool]:
        """Which of `slots` the allocator holds as free (its free and release lists), by a mask."""
        import torch

        if not slots:
            return []
        free = torch.zeros(self.allocator.size + 1, dtype=torch.bool)  # slots 1..size; 0 pads
        # index_fill_, not `free[pages] = True`: an index_put over thousands of slots is ten times
        # slower on two threads.
        free.index_fill_(0, self.allocator.free_pages, True)
        free.index_fill_(0, self.allocator.release_pages, True)
        return free[torch.tensor(slots, dtype=torch.int64)].tolist()

    def read_kv(self, slots: list[int]) -> tuple[list[int], list[int]]:
        return self.worker.read_kv(slots)

    def handle(self, rid: str) -> int:
        return self.worker.handle(rid)

    def writer(self, handle: int) -> str:
        return self.worker.kv_writers[handle]


def capture_outputs(scheduler: Any, on_finish: Callable[[str, Any], None] | None = None) -> dict[str, list[int]]:
    """What the client would receive, kept instead of sent to the sockets nobody reads: per
    request, the output token ids its BatchTokenIDOutputs carried, in order (each carries the
    ones not sent before: output_streamer.py's send_token_offset); `on_finish(rid, reason)` hears
    each finish reason the client is sent. The SenderWrapper instances are shared with the output
    streamer. A streaming session's turns share their request's id: its list holds every turn's."""
    received: dict[str, list[int]] = {}
    channels = scheduler.ipc_channels

    def send_output(output: Any, recv_obj: Any = None) -> None:
        if type(output).__name__ == "AbortReq":  # a request the scheduler ended outside the stream
            if on_finish is not None and output.rid is not None:
                on_finish(output.rid, output.finished_reason or {"type": "abort"})
            return
        rids = getattr(output, "rids", None) or []
        for rid, ids in zip(rids, getattr(output, "output_ids", None) or []):
            received.setdefault(rid, []).extend(int(t) for t in ids or ())
        if on_finish is not None:
            for rid, reason in zip(rids, getattr(output, "finished_reasons", None) or []):
                if reason is not None:
                    on_finish(rid, reason)

    for sender in (channels.send_to_tokenizer, channels.send_to_detokenizer):
        sender.send_output = send_output
    return received


def refuse_capped(scheduler: Any) -> None:
    """SGLang caps a request's max_new_tokens to what its KV pool and context can hold
    (init_req_max_new_tokens); a capped request would not run as the workload asks: one line."""
    cap = scheduler.init_req_max_new_tokens

    def init_req_max_new_tokens(req: Any) -> None:
        asked = req.sampling_params.max_new_tokens  # the request's (a streaming turn's own)
        cap(req)
        got = req.sampling_params.max_new_tokens
        if got != asked:  # bad input, not an observer's failure: no guard
            raise InputError(
                f"--engine sglang-scheduler: SGLang caps request {req.rid!r}'s max_tokens {asked} to {got} "
                "(its context, its KV pool or SGLANG_MAX_NEW_TOKENS_LIMIT holds no more)"
            )

    scheduler.init_req_max_new_tokens = init_req_max_new_tokens


@contextlib.contextmanager
def sglang_checks() -> Iterator[None]:
    """SGLang's invariant checks on for the run (families/sglang/setup.py CHECKS), then as they were."""
    saved = {name: os.environ.get(name) for name in sglang_setup.CHECKS}
    os.environ.update(sglang_setup.CHECKS)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_sglang(
    workload: Workload,
    impl: Implementation,
    device: str = "cpu",
    oracle: Oracle | None = None,
    progress: ProgressFn | None = None,
    worker_class: type[SglangReferenceWorker] | None = None,
    journal: str | os.PathLike[str] | None = None,
    flush_every: int = FLUSH_EVERY,
) -> Trace:
    """Run `workload` on SGLang's scheduler with the reference SGLang worker (`worker_class`: it
    or a subclass; None: the implementation's, `Implementation.sglang_worker_class`) on `device`,
    taking its outcomes from `oracle` (default: the workload's), and return the trace. Refused in
    one line before anything is built: what SGLang cannot take.
    `journal`: where the settled rows go every `flush_every` iterations, and everything recorded
    on any exception, as the loop engines keep theirs (engines/run.py)."""
    from specreplay.replay.engines.run import fewer_full_collections, trace_header

    sglang_setup.refuse_workload(workload)
    sglang_setup.require_sglang()
    oracle = oracle if oracle is not None else Oracle(workload)
    oracle.turn_keeps_last_sampled = True  # SGLang's streaming turns (families/sglang/sessions.py)
    config = workload.config
    k = config.num_spec_tokens
    worker_class = worker_class or impl.sglang_worker_class()
    worker = worker_class(oracle, config.num_blocks * config.block_size, k, device)
    recorder = Recorder()
    # SGLang picks the port of its gloo process group from Python's global `random`
    # (PortArgs.init_new), which the last Scheduler built in this process seeded with its workload's
    # seed (scheduler.py:1261): two processes running the same seeds (gate --jobs 2 on goldens of
    # seed 0, two test runs) would pick the same port and one would fail to bind it. Reseeded from
    # the OS; the new Scheduler seeds it again for its run, so the trace does not change.
    random.seed()
    writer: JournalWriter | None = None
    with tempfile.TemporaryDirectory(prefix="specreplay-sglang-") as folder, sglang_checks(), fewer_full_collections():
        sessions = any(spec.streaming for spec in workload.requests)
        scheduler = sglang_setup.build_scheduler(config, worker, Path(folder), workload.seed, impl, sessions)
        scheduler_class = type(scheduler)
        header = trace_header(workload, _described(impl, scheduler_class, worker_class, config), device, run_outcome(0))
        if journal is not None:
            writer = JournalWriter(journal, header)
            recorder.journal, recorder.flush_every = writer, flush_every
        try:
            order = {spec.request_id: i for i, spec in enumerate(workload.requests)}
            truth = SglangTruth(oracle, KvView(scheduler, worker))
            steps_for = getattr(scheduler.draft_worker, "steps_for_batch", None)  # adaptive speculation's
            observer = SglangObserver(scheduler, recorder, oracle, truth, k=k, order=order, steps_for=steps_for)
            attach(observer, lambda: worker.last_forward)
            refuse_capped(scheduler)
            receiver = ScriptedReceiver(scheduler, workload, oracle, observer, progress, recorder)
            received = capture_outputs(scheduler, receiver.sessions.answered)
            scheduler.request_receiver = receiver
            try:
                scheduler.run_event_loop()  # returns once the ShutdownReq's gracefully_exit is seen
                outcome = run_outcome(receiver.iteration)
            except StepLimit:
                outcome = run_outcome(receiver.iteration, cut=True)
            except Exception as exc:
                crash = crash_outcome(exc, impl, (scheduler, observer), worker)  # the observer knows its ids
                if crash is None:
                    raise
                outcome = run_outcome(receiver.iteration, crash=crash)
            outcome = dataclasses.replace(
                outcome,
                engine_output_tokens={rid: len(ids) for rid, ids in received.items()},
                engine_output_ids=dict(received),
            )
        finally:
            # Whatever ended the run (its end, a crash, specreplay's own failure, Ctrl-C): what
            # was recorded is in the journal before anything propagates.
            recorder.flush(everything=True)
            if writer is not None:
                writer.close()
            sglang_setup.close_scheduler(scheduler)
    return dataclasses.replace(header, table=recorder.table(), outcome=outcome)


def _described(impl: Implementation, scheduler_class: type, worker_class: type, config: Any) -> Any:
    """What ran, for the trace header: the Scheduler class built (the variant's on the driver's)
    and the reference worker."""
    from specreplay.replay.engines.registry import engine

    return engine("sglang-scheduler").describe(
        impl,
        scheduler_class.__module__ + "." + scheduler_class.__qualname__,
        f"{worker_class.__module__}.{worker_class.__qualname__}",
        config,
        runner_family="sglang",
        patches=list(sglang_setup.PATCHES),
    )


__all__ = ["KvView", "ScriptedReceiver", "StepLimit", "run_sglang"]
