"""Hypothesis strategies for workloads with every request field (explicit prompts, prefixes seeded
and given, turns at a fixed step or after a finish, acceptance lists): one for the file format's
round trip (test_workload.py) and the notation's (test_notation.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.request_spec import Prefix
from specreplay.replay.workloads.workload import RequestSpec, Workload


@st.composite
def workloads(draw, ids: st.SearchStrategy[str] | None = None, vocabs=(512,), engine_flags: bool = False) -> Workload:
    """`ids`: the request ids' strategy (default r0, r1, ...); `vocabs`: the vocabulary sizes to
    draw from; `engine_flags`: also draw the scheduling mode and the prefix-cache settings."""
    k = draw(st.integers(0, 4))
    vocab = draw(st.sampled_from(vocabs))
    token_ids = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6).map(tuple)
    names = draw(st.lists(st.sampled_from(["sys", "doc", "p"]), unique=True, max_size=2))
    prefixes = tuple(
        Prefix(n, ids=draw(token_ids)) if draw(st.booleans()) else Prefix(n, draw(st.integers(1, 40))) for n in names
    )
    count = draw(st.integers(1, 5))
    rids = (
        draw(st.lists(ids, unique=True, min_size=count, max_size=count))
        if ids is not None
        else [f"r{i}" for i in range(count)]
    )
    requests: list[RequestSpec] = []
    for rid in rids:
        followable = [r.request_id for r in requests if r.abort_step is None and not r.streaming]
        shape = draw(st.sampled_from(["plain", "prefix", "follows", "embeds"]))
        follows = draw(st.sampled_from(followable)) if shape == "follows" and followable else None
        after = draw(st.none() | st.integers(1, 4)) if follows else None
        embeds = shape == "embeds"  # a prompt sent as embeddings: no ids, prefix, turn or stream of its own
        streaming = after is None and not embeds and draw(st.booleans())
        acceptance = draw(
            st.none()
            | st.sampled_from(["all", "none", "alternate", "random:0.25"])
            | (st.lists(st.integers(0, k), min_size=1, max_size=4).map(tuple) if not streaming else st.none())
        )
        requests.append(
            RequestSpec(
                rid,
                arrival_step=1 if after else draw(st.integers(1, 9)),
                prompt_len=draw(st.integers(1, 12)),
                max_tokens=draw(st.integers(1, 12)),
                abort_step=draw(st.none() | st.integers(1, 9)) if not after and not streaming else None,
                stop_at=draw(st.none() | st.integers(1, 12)) if not streaming else None,
                acceptance=acceptance,
                streaming=streaming,
                prompt=None if embeds else draw(st.none() | token_ids),
                prefix=draw(st.sampled_from(names)) if shape == "prefix" and names else None,
                follows=follows,
                after_finish=after,
                input_embeds=embeds,
            )
        )
    flags = {}
    if engine_flags:
        flags = {
            "async_scheduling": draw(st.booleans()),
            "enable_prefix_caching": draw(st.booleans()),
            "eagle_block_drop": k > 0 and draw(st.booleans()),
        }
    config = EngineConfig(num_spec_tokens=k, vocab_size=vocab, **flags)
    return Workload(tuple(requests), config, seed=draw(st.integers(0, 99)), prefixes=prefixes)
