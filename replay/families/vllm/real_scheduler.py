"""`--engine vllm-scheduler`: the installed vLLM's real Scheduler / AsyncScheduler, fed by the
reference runner.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. `VllmSchedulerAdapter` offers the engine loop the `SchedulerPort` the
reference scheduler offers: it builds a real vLLM config (a tiny model config written to a temporary
folder, no weights, no hub), converts the real `SchedulerOutput` into specreplay's message for the
reference runner and the runner's output into a real `ModelRunnerOutput`. It records nothing: the
scheduler observer watches the real scheduler (`adapter.real`) as it watches any other.
"""

from __future__ import annotations

from typing import Any

from specreplay.replay.families.vllm.setup import (
    asserting,
    require_version,
    reserve_lookahead,
    sampling_params,
    speculative_config,
    tiny_model_dir,
)
from specreplay.replay.models.messages import CachedRequestData, ModelRunnerOutput, NewRequestData, SchedulerOutput
from specreplay.replay.models.request import Request
from specreplay.replay.observers.message_shapes import reentry_tokens, resumed_ids, runner_output
from specreplay.replay.workloads.config import EngineConfig
from specreplay.traces.errors import InputError


class VllmSchedulerAdapter:
    """The real vLLM scheduler behind the reference scheduler's interface."""

    def __init__(self, config: EngineConfig, scheduler_cls: Any = None) -> None:
        require_version(config)
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        self.config = config
        self.k = config.num_spec_tokens
        self.is_async = config.async_scheduling
        try:
            model = ModelConfig(
                model=tiny_model_dir(config),
                dtype="float32",
                skip_tokenizer_init=True,
                max_model_len=config.max_model_len,
            )
            sched = SchedulerConfig(
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_num_seqs=config.max_num_seqs,
                max_model_len=config.max_model_len,
                is_encoder_decoder=False,
                enable_chunked_prefill=True,
                async_scheduling=config.async_scheduling,
                long_prefill_token_threshold=config.long_prefill_token_threshold,
            )
            cache = CacheConfig(block_size=config.block_size, enable_prefix_caching=config.enable_prefix_caching)
            vllm_config = VllmConfig(
                model_config=model,
                scheduler_config=sched,
                cache_config=cache,
                speculative_config=speculative_config(config, SpeculativeConfig),
            )
        except Exception as exc:  # pydantic, ValueError, a platform RuntimeError: vLLM says no
            raise InputError(f"vllm rejects this engine config: {' '.join(str(exc).split())[:200]}") from None
        reserve_lookahead(vllm_config, config.num_lookahead_tokens)
        cache.num_gpu_blocks = config.num_blocks
        kv = KVCacheConfig(
            num_blocks=config.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["layer"],
                    FullAttentionSpec(block_size=config.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32),
                )
            ],
        )
        cls = scheduler_cls or (AsyncScheduler if config.async_scheduling else Scheduler)
        try:
            self.real = cls(
                vllm_config=vllm_config,
                kv_cache_config=kv,
                structured_output_manager=StructuredOutputManager(vllm_config),
                block_size=config.block_size,
                log_stats=False,
            )
        except Exception as exc:
            if scheduler_cls is not None:
                raise  # a variant's constructor: the caller reports whose it is
            raise InputError(
                f"vllm {type(exc).__name__} while building its scheduler: {' '.join(str(exc).split())[:200]}"
            ) from None
        lookahead = eagle_drafter(self.real, config) if config.eagle_block_drop else 0
        # As vLLM's EngineCore sets up prefix caching: its configured hash over the block's tokens.
        hash_fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        # vLLM 0.33.0's hasher takes the lookahead (0.32.0's has no such argument, nor needs it).
        hasher: Any = get_request_block_hasher
        self._hasher = hasher(config.block_size, hash_fn, *([lookahead] if lookahead else []))
        self.step = 0
        self._outputs: dict[int, Any] = {}  # our step -> the real SchedulerOutput

    @property
    def requests(self) -> dict[str, Any]:
        """The real scheduler's live requests (the workload's ids: this adapter adds no suffix)."""
        return self.real.requests

    @property
    def running(self) -> list[Any]:
        return self.real.running

    # ---------------------------------------------------------------- requests
    def add_request(self, req: Request) -> Any:
        from vllm.v1.request import Request as VllmRequest

        real = VllmRequest(
            request_id=req.request_id,
            prompt_token_ids=list(req.prompt_token_ids),
            sampling_params=sampling_params(req.max_tokens, req.stop_token_id),
            pooling_params=None,
            block_hasher=self._hasher,
            resumable=req.resumable,
        )
        asserting(self.real.add_request, real)  # a live id, not resumable: "duplicate request id"
        return self.real.requests.get(req.request_id, real)

    def has_requests(self) -> bool:
        return self.real.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        return self.real.has_finished_requests()

    @property
    def pause_state(self) -> str:
        return self.real.pause_state.name.lower()

    def set_pause_state(self, state: str) -> None:
        from vllm.v1.core.sched.interface import PauseState

        self.real.set_pause_state(PauseState[state.upper()])

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        try:
            return self.real.reset_prefix_cache(reset_running_requests=reset_running_requests)
        except RuntimeError:
            # "Failed to reset KV cache even when all the running requests are preempted": a
            # request outside `running` holds blocks (a streaming session between turns). vLLM
            # returns the error to the caller and the engine goes on, the preemptions done.
            return False

    def finish_requests(self, request_ids: list[str]) -> list[str]:
        """Abort the live ones among `request_ids`; returns those."""
        from vllm.v1.request import RequestStatus

        live = [r for r in request_ids if r in self.real.requests and not self.real.requests[r].is_finished()]
        if live:
            self.real.finish_requests(live, RequestStatus.FINISHED_ABORTED)
        return live

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        self.step += 1
        so = asserting(self.real.schedule)
        self._outputs[self.step] = so
        out = convert_output(so, self.step)
        out._specreplay_step = getattr(so, "_specreplay_step", self.step)  # the observer's stamp, for the worker's
        return out

    # ---------------------------------------------------------------- update_from_output
    def update_from_output(self, out: SchedulerOutput, model_output: ModelRunnerOutput) -> None:
        from vllm.v1.outputs import ModelRunnerOutput as VllmModelRunnerOutput

        so = self._outputs.pop(out.step)
        # In-process executor: the worker may have edited the object the scheduler reads back
        # (`out` is what it ran); with a private copy `out` is unchanged and this changes nothing.
        so.num_scheduled_tokens.clear()
        so.num_scheduled_tokens.update(out.num_scheduled_tokens)
        so.total_num_scheduled_tokens = out.total_num_scheduled_tokens
        so.scheduled_spec_decode_tokens.clear()
        so.scheduled_spec_decode_tokens.update(out.scheduled_spec_decode_tokens)
        real_out = runner_output(
            VllmModelRunnerOutput, list(model_output.req_ids), [list(t) for t in model_output.sampled_token_ids]
        )
        asserting(self.real.update_from_output, so, real_out)

    def update_draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> None:
        from vllm.v1.outputs import DraftTokenIds

        self.real.update_draft_token_ids(DraftTokenIds(list(req_ids), [list(d) for d in drafts]))


def eagle_drafter(scheduler: Any, config: EngineConfig) -> int:
    """What an EAGLE-style drafter changes in the scheduler's prefix cache (SpeculativeConfig's
    use_eagle_block_drop, read when the scheduler is built), set on the built scheduler as vLLM
    would have set it: the adapter's speculative config is an n-gram one (no draft model to
    load). vLLM 0.32.0: a hit drops its last block; 0.33.0: each block hash covers the next
    token instead (num_hash_lookahead_tokens 1, for the request hasher). Returns that lookahead."""
    from specreplay.replay.models.releases import release_of

    if release_of(config.vllm_version).eagle_hash_lookahead:
        scheduler.num_hash_lookahead_tokens = 1
        scheduler.kv_cache_manager.block_pool.num_hash_lookahead_tokens = 1
        return 1
    coordinator = scheduler.kv_cache_manager.coordinator
    coordinator.eagle_group_ids = {0}
    coordinator.single_type_managers[0].use_eagle = True
    scheduler.use_eagle_block_drop = True
    return 0


def convert_output(so: Any, step: int) -> SchedulerOutput:
    """A real SchedulerOutput as specreplay's message, for the reference runner."""
    c = so.scheduled_cached_reqs
    cached = CachedRequestData(
        req_ids=list(c.req_ids),
        resumed_req_ids=set(resumed_ids(c)),
        new_block_ids=[list(b[0]) if b else [] for b in c.new_block_ids],
        num_computed_tokens=list(c.num_computed_tokens),
        num_output_tokens=list(c.num_output_tokens),
        all_token_ids={r: list(t) for r, t in reentry_tokens(c).items()},
    )
    new = [
        NewRequestData(
            d.req_id,
            list(d.prompt_token_ids or ()),
            list(d.block_ids[0]),
            d.num_computed_tokens,
            list(d.prefill_token_ids) if getattr(d, "prefill_token_ids", None) is not None else None,
        )
        for d in so.scheduled_new_reqs
    ]
    return SchedulerOutput(
        step=step,
        scheduled_new_reqs=new,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=dict(so.num_scheduled_tokens),
        total_num_scheduled_tokens=so.total_num_scheduled_tokens,
        scheduled_spec_decode_tokens={r: list(t) for r, t in so.scheduled_spec_decode_tokens.items()},
        finished_req_ids=set(so.finished_req_ids),
        preempted_req_ids=set(so.preempted_req_ids or ()),
        num_spec_tokens_to_schedule=so.num_spec_tokens_to_schedule,
        skip_drafts=bool(getattr(so, "skip_drafts", False)),  # 0.33.0 on
    )
