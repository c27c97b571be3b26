"""SGLang's worker contract, kept by the reference SGLang worker: the workers SGLang's scheduler builds.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. SGLang 0.5.23's Scheduler sees its model worker through a narrow
contract: the pools the worker allocates (`alloc_memory_pool`), `get_worker_info()`, and what
`forward_batch_generation(batch)` returns (a GenerationBatchResult: the next token ids; under spec
v2 the accept lengths, the new seq_lens it publishes to the FutureMap through `on_publish`, and
the next round's EagleDraftInput). These classes keep that contract and hand the work to the
reference SGLang worker (families/sglang/worker.py), which knows nothing of SGLang:

- `PoolRunner` stands in for ModelRunner: SGLang's real ReqToTokenPool, MHATokenToKVPool,
  TokenToKVPoolAllocator and KVIndexTranslator (tiny, on the CPU), sized by the engine config
  instead of by profiling GPU memory, and the plain values the scheduler reads. It has no
  `__getattr__`: a read of an attribute another SGLang release adds fails here, not as a None.
- `ReferenceTpWorker` (a BaseTpWorker) does what TpModelWorker does up to the model
  (tp_worker.py:662): SGLang's own `ForwardBatch.init_new` gives the positions, the input ids
  and the KV slots (`out_cache_loc`) of an extend or decode batch; the reference worker writes
  them and samples.
- `ReferenceEagleWorker` (a BaseSpecWorker) is EAGLEWorkerV2's contract (eagle_worker_v2.py
  forward_batch_generation and _forward_prefill_batch): an extend is the target's prefill with
  `new_seq_lens = seq_lens` published; a decode batch is one verify round at `L = seq_lens` (as
  resolved from the FutureMap), its k + 1 slots read from the request's `req_to_token` row at
  L.. as `eagle_prepare_for_verify` assigns them, its bonus token and first draft taken from the
  relayed EagleDraftInput (`bonus_tokens`, `topk_index`), and `new_seq_lens = L + accept_lens`
  published before it returns. With adaptive speculation (`--speculative-adaptive`) k is SGLang's
  own policy's (AdaptiveSpeculativeParams), picked when a decode forward starts and after each
  processed verify, and published into the spec config the scheduler reserves KV by, as
  EAGLEWorkerV2's `apply_runtime_state` does.
- `DrivenScheduler` is SGLang's Scheduler with exactly two constructors overridden
  (`init_tp_model_worker`, `maybe_init_draft_worker`) to build these; `init_model_worker`, the
  pool wiring, prewarm and everything else in `Scheduler.__init__` run unchanged. A variant of
  SGLang's scheduler (`--impl`, families/sglang/forms.py) runs as its subclass (`scheduler_class`):
  the variant's one override over SGLang's, the driver's constructors over both.

The real TpModelWorker cannot be built on these CPU machines: its ModelRunner loads the model
through rotary-embedding ops that need CUDA, vLLM's custom ops or sgl_kernel's CPU build.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from specreplay.replay.families.sglang import setup as sglang_setup

sglang_setup.prepare()  # before the first sglang import: the torchvision stub and the patches

import torch  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.tp_worker import BaseTpWorker  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.mem_cache.allocation_sizing import get_req_to_token_extra_context_len  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch  # noqa: E402
from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (  # noqa: E402
    NgramEmbeddingManager,
)
from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig  # noqa: E402
from sglang.srt.runtime_context import get_context, get_spec  # noqa: E402
from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams  # noqa: E402
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker  # noqa: E402
from sglang.srt.speculative.eagle_info import EagleDraftInput  # noqa: E402

from specreplay.replay.families.sglang.worker import Row, RowResult, SglangReferenceWorker, token_rows  # noqa: E402
from specreplay.replay.workloads.config import EngineConfig  # noqa: E402


class PoolRunner:
    """The ModelRunner attributes that Scheduler.__init__, init_model_worker and the loops read:
    SGLang's real pools, and plain values (module docstring)."""

    def __init__(self, model_config: Any, config: EngineConfig, spec_algorithm: Any) -> None:
        self.device = "cpu"
        self.gpu_id = 0
        self.model_config = model_config
        self.engine_config = config
        self.page_size = 1
        self.spec_algorithm = spec_algorithm
        self.model = torch.nn.Module()
        self.forward_stream = torch.cpu.Stream()
        self.attn_backend = SimpleNamespace(needs_cpu_seq_lens=True, folds_encoder_swa_replay=False)
        # SGLang's pool objects, built by alloc_memory_pool (init_model_worker calls it).
        self.memory_pool_config: Any = None
        self.req_to_token_pool: Any = None
        self.token_to_kv_pool: Any = None
        self.token_to_kv_pool_allocator: Any = None
        self.kv_index_translator: Any = None
        self.ngram_embedding_manager: Any = None
        slots = config.num_blocks * config.block_size
        self.max_running_requests = config.max_num_seqs
        self.logical_max_total_num_tokens = slots
        self.effective_logical_max_total_num_tokens = slots
        self.full_max_total_num_tokens = slots
        self.swa_max_total_num_tokens = 0
        self.sliding_window_size = None
        self.is_hybrid_swa = False
        self.prefill_aware_swa = False
        self.mtp_draft_device_pools = None
        self.mtp_draft_mamba_pools = None
        self.canary_manager = None
        self.lora_manager = None
        self.hisparse_coordinator = None
        self.shared_read_done_event = None
        self.weight_load_time = 0.0
        self.weight_load_mem_usage = 0.0
        self.preloaded_weights_bytes = 0
        self.graph_memory_usage: dict[str, float] = {}
        self.graph_time_usage: dict[str, float] = {}
        self.is_draft_worker = False
        self.prefill_attention_backend_str = None

    def account_preloaded_weights(self, nbytes: int) -> None:
        pass

    def alloc_memory_pool(self) -> None:
        """SGLang's pool classes at the engine config's sizes; each request row as long as SGLang
        makes it (the context plus its spec headroom, allocation_sizing.py)."""
        slots, rows = self.logical_max_total_num_tokens, self.max_running_requests
        self.memory_pool_config = MemoryPoolConfig(max_total_num_tokens=slots, max_running_requests=rows)
        self.req_to_token_pool = ReqToTokenPool(
            size=rows,
            max_context_len=self.model_config.context_len + get_req_to_token_extra_context_len(),
            device="cpu",
            enable_memory_saver=False,
        )
        self.token_to_kv_pool = MHATokenToKVPool(
            size=slots,
            page_size=1,
            dtype=torch.float16,
            head_num=1,
            head_dim=4,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
            size=slots, dtype=torch.float16, device="cpu", kvcache=self.token_to_kv_pool, need_sort=False
        )
        self.kv_index_translator = KVIndexTranslator(
            req_to_token=self.req_to_token_pool.req_to_token,
            token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            token_to_kv_pool=self.token_to_kv_pool,
            page_size=1,
            device="cpu",
        )
        self.ngram_embedding_manager = NgramEmbeddingManager.from_model(
            model=self.model,
            model_config=self.model_config,
            req_to_token_pool=self.req_to_token_pool,
            max_running_requests=rows,
            device="cpu",
        )

    def prewarm_sampling(self) -> None:
        return None


class ReferenceTpWorker(BaseTpWorker):
    """The target worker (module docstring): SGLang's ForwardBatch, the reference worker's tokens."""

    def __init__(self, model_config: Any, config: EngineConfig, spec_algorithm: Any, worker: SglangReferenceWorker):
        self._model_runner = PoolRunner(model_config, config, spec_algorithm)
        self.model_config = model_config
        self.engine_config = config
        self.model_runner_list: list[Any] = []
        self.reference = worker
        self.device = "cpu"
        self.random_seed = 0
        self.dllm_algorithm = None

    @property
    def model_runner(self) -> PoolRunner:
        return self._model_runner

    def alloc_memory_pool(self, memory_pool_config: Any = None, *, draft_parallel_layout: Any = None) -> None:
        self._model_runner.alloc_memory_pool()

    def init_attention_backends(self) -> None:
        pass

    def init_cuda_graphs(self) -> None:
        pass

    def get_worker_info(self) -> tuple:
        """TpModelWorker.get_worker_info's 12 values (tp_worker.py:550), from the pools."""
        runner = self._model_runner
        max_req_len = min(self.model_config.context_len - 1, runner.effective_logical_max_total_num_tokens - 1)
        return (
            runner.logical_max_total_num_tokens,
            self.engine_config.max_num_batched_tokens,  # max_prefill_tokens
            runner.max_running_requests,
            None,  # max_queued_requests
            max_req_len,
            max_req_len - 5,  # max_req_input_len
            self.random_seed,
            "cpu",
            runner.forward_stream,
            runner.req_to_token_pool.size,
            runner.req_to_token_pool.max_context_len,
            runner.token_to_kv_pool.size,
        )

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> GenerationBatchResult:
        results = self.run(batch)
        tokens = torch.tensor([r.emitted[0] for r in results], dtype=torch.int64)
        return GenerationBatchResult(logits_output=None, next_token_ids=tokens)

    def run(self, batch: Any) -> list[RowResult]:
        """An extend or decode batch on the reference worker, through SGLang's own ForwardBatch."""
        fb = ForwardBatch.init_new(batch, self._model_runner, return_hidden_states_before_norm=False)
        positions, slots, ids = fb.positions.tolist(), fb.out_cache_loc.tolist(), fb.input_ids.tolist()
        rows = []
        at = embedded_at = 0
        extend = batch.forward_mode.is_extend()
        counts = fb.extend_seq_lens_cpu if extend else [1] * len(batch.reqs)
        for req, n in zip(batch.reqs, counts):
            fed = ids[at : at + n]
            if extend and req.input_embeds is not None:
                # A model fed embeddings reads one row per input position in place of the ids
                # (SGLang's placeholders): the batch holds the rows of its embedding requests, in
                # batch order.
                held = fb.input_embeds[embedded_at : embedded_at + n] if fb.input_embeds is not None else ()
                if len(held) != n:
                    raise RuntimeError(
                        f"request {req.rid}: the extend feeds {n} positions but the batch holds {len(held)} of its "
                        "embedding rows"
                    )
                fed = sglang_setup.embedded_tokens(held)
                embedded_at += n
            rows.append(
                Row(
                    req.rid,
                    len(req.origin_input_ids),
                    positions[at],
                    tuple(fed),
                    tuple(slots[at : at + n]),
                    fill_len=len(req.origin_input_ids) + len(req.output_ids),
                )
            )
            at += n
        return self.reference.extend(rows) if extend else self.reference.decode(rows)


class ReferenceEagleWorker(BaseSpecWorker):
    """EAGLE v2 (topk 1) as the scheduler sees it (module docstring)."""

    def __init__(self, target: ReferenceTpWorker, num_steps: int) -> None:
        super().__init__()
        self._target_worker = target
        self._draft_worker = None
        self.num_steps = num_steps
        self.num_draft_tokens = num_steps + 1
        self.device = "cpu"
        self.req_to_token_pool: Any = None
        self.token_to_kv_pool_allocator: Any = None
        # Adaptive speculative decoding (--speculative-adaptive): SGLang's own step policy
        # (AdaptiveSpeculativeParams, uncopied) picks the steps per batch size from the accept
        # lengths, as EAGLEWorkerV2's AdaptiveController feeds it.
        spec = get_spec()
        self.adaptive = (
            AdaptiveSpeculativeParams(num_steps, cfg_path=spec.speculative_adaptive_config)
            if spec.speculative_adaptive
            else None
        )

    # The adaptive protocol (eagle_worker_v2.py on_verify_complete_cpu, activate_step_by_batch).
    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
        if self.adaptive is not None:
            steps = self.adaptive.on_verify_complete(num_correct_drafts_per_req, batch_size)
            if steps is not None:
                self.switch_steps(steps)

    def activate_step_by_batch(self, batch_size: int) -> None:
        steps = self.steps_for_batch(batch_size)
        if steps != self.num_steps:
            self.switch_steps(steps)

    def steps_for_batch(self, batch_size: int) -> int:
        """The steps a decode round of `batch_size` requests runs with (what activate_step_by_batch
        picks; nothing changes it between a batch's scheduling and its forward)."""
        return self.adaptive.get_steps_for_batch(batch_size) if self.adaptive is not None else self.num_steps

    def switch_steps(self, steps: int) -> None:
        """What `apply_runtime_state` changes that the scheduler and the reference worker see: the
        worker's steps, and the published speculative_num_steps / num_draft_tokens the scheduler's
        decode allocation reads (allocation_sizing.get_alloc_len_per_decode)."""
        self.num_steps, self.num_draft_tokens = steps, steps + 1
        self._target_worker.reference.k = steps
        get_context().override(
            "adaptive_spec.restore", speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1
        )

    # What init_model_worker asks of a draft worker (its pools are the target's).
    def alloc_memory_pool(
        self, memory_pool_config: Any = None, req_to_token_pool: Any = None, token_to_kv_pool_allocator: Any = None
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator

    def init_hicache_draft_plan(self) -> None:
        pass

    def init_attention_backends(self) -> None:
        pass

    def init_cuda_graphs(self) -> None:
        pass

    def prewarm_sampling(self) -> None:
        return None

    @property
    def last_shared_read_runner(self) -> PoolRunner:
        return self._target_worker.model_runner

    def forward_batch_generation(
        self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None, pp_proxy_tensors: Any = None
    ) -> GenerationBatchResult:
        target = self._target_worker
        if batch.forward_mode.is_extend():
            results = target.run(batch)
            result = GenerationBatchResult(
                logits_output=None, next_token_ids=torch.tensor([r.emitted[0] for r in results], dtype=torch.int64)
            )
            result.new_seq_lens = batch.seq_lens  # spec v2: the length before this round's tokens
        else:
            self.activate_step_by_batch(batch.seq_lens.shape[0])  # as EAGLEWorkerV2 before a decode round
            results = self.verify(batch)
            k1 = self.num_draft_tokens
            accept_lens = torch.tensor([len(r.emitted) for r in results], dtype=torch.int32)
            result = GenerationBatchResult(
                logits_output=None,
                next_token_ids=torch.tensor(token_rows(results, k1), dtype=torch.int64),
                speculative_num_draft_tokens=k1,
                accept_lens=accept_lens,
                new_seq_lens=batch.seq_lens + accept_lens,
            )
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        bonus = torch.tensor([r.emitted[-1] for r in results], dtype=torch.int64)
        drafts = torch.tensor([r.next_draft if r.next_draft is not None else 0 for r in results], dtype=torch.int64)
        result.next_draft_input = self.draft_input(bonus, drafts)
        return result

    def verify(self, batch: Any) -> list[RowResult]:
        """One verify round per request: L = its seq_len as the worker received it (after the
        FutureMap's resolution), the k + 1 slots `req_to_token[row, L:L+k+1]` (what
        eagle_prepare_for_verify's assign_extend_cache_locs gives), the relayed bonus and draft."""
        spec = batch.spec_info
        seq_lens = batch.seq_lens.tolist()
        pool_rows = batch.req_pool_indices.tolist()
        bonus = spec.bonus_tokens.tolist()
        first = spec.topk_index[:, 0].tolist() if spec.topk_index is not None else [None] * len(seq_lens)
        table = self.req_to_token_pool.req_to_token
        k1 = self.num_draft_tokens
        rows = [
            Row(
                req.rid,
                len(req.origin_input_ids),
                seq_len,
                (bonus[i],),
                tuple(table[pool_rows[i], seq_len : seq_len + k1].tolist()),
                relayed_draft=first[i],
            )
            for i, (req, seq_len) in enumerate(zip(batch.reqs, seq_lens))
        ]
        return self._target_worker.reference.verify(rows)

    @staticmethod
    def draft_input(bonus: torch.Tensor, first_drafts: torch.Tensor) -> EagleDraftInput:
        """The next round's draft input: the bonus token, and the draft model's top-1 (topk 1) as
        `topk_index` with probability 1 (`filter_batch` slices both: eagle_info.py:248)."""
        n = bonus.shape[0]
        return EagleDraftInput(
            bonus_tokens=bonus.to(torch.int32),
            topk_p=torch.ones((n, 1), dtype=torch.float32),
            topk_index=first_drafts.view(n, 1),
        )


class DrivenScheduler(Scheduler):
    """SGLang's Scheduler; only the two worker constructors build the reference workers."""

    def __init__(self, server_args: Any, port_args: Any, *, config: EngineConfig, worker: SglangReferenceWorker):
        self._engine_config = config
        self._reference = worker
        super().__init__(server_args, port_args)

    def init_tp_model_worker(self) -> None:  # scheduler.py:1018
        self.tp_worker = ReferenceTpWorker(self.model_config, self._engine_config, self.spec_algorithm, self._reference)

    def maybe_init_draft_worker(self) -> None:  # scheduler.py:1035
        self.external_corpus_manager = None
        if self.spec_algorithm.is_none():
            self.draft_worker = None
            return
        self.draft_worker = ReferenceEagleWorker(self.tp_worker, self._engine_config.num_spec_tokens)


def scheduler_class(impl: Any) -> type:
    """The Scheduler class a run of `impl` builds: `DrivenScheduler`, or the implementation's
    variant of it (its SGLang form, families/sglang/forms.py: the variant's override over the
    driver's worker constructors over SGLang's Scheduler). The trace header names this class."""
    return DrivenScheduler if impl is None else impl.sglang_scheduler_class(DrivenScheduler)


__all__ = ["DrivenScheduler", "PoolRunner", "ReferenceEagleWorker", "ReferenceTpWorker", "scheduler_class"]
