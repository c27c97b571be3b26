"""The seeded generators (replay/workloads/generators.py): explore's draws share prompts at a
modest rate (a prefix of whole blocks and maybe part of one, a conversation's next turn), from
their own generator, so the rest of a seed's draw is what it was; `--scenario random` draws none."""

from __future__ import annotations

from specreplay.replay.families.sglang.setup import refuse_workload
from specreplay.replay.families.sglang.shape import taken_by_sglang
from specreplay.replay.workloads import generators
from specreplay.replay.workloads.generators import explore_workload, random_workload
from specreplay.replay.workloads.workload import Workload

PROFILES = ((), ("events",), ("kv-pressure", "long-prompts"), ("aborts", "idle-gaps"), ("model-len-edge",))
DRAWS = [(seed, profiles) for seed in range(60) for profiles in PROFILES]


def test_explore_draws_shared_prefixes_and_turns_at_a_modest_rate():
    prefixed = turns = after_finish = 0
    for seed, profiles in DRAWS:
        w = explore_workload(seed, profiles)
        assert Workload.from_dict(w.to_dict()) == w  # valid, and every field written
        sharing = [r for r in w.requests if r.prefix is not None]
        if sharing:
            prefixed += 1
            (prefix,) = w.prefixes
            assert prefix.length >= w.config.block_size  # one block or more: something to cache
        follow_ups = [r for r in w.requests if r.follows is not None]
        turns += bool(follow_ups)
        after_finish += any(r.after_finish is not None for r in follow_ups)
        for r in w.requests:  # and it still fits, as every draw did
            assert w.prompt_len_of(r.request_id) + r.max_tokens <= w.config.max_model_len
    assert 0.1 * len(DRAWS) < prefixed < 0.35 * len(DRAWS)
    assert 0.05 * len(DRAWS) < turns < 0.3 * len(DRAWS)
    assert after_finish > 0


def test_the_rest_of_a_draw_is_what_it_was_without_shared_prompts(monkeypatch):
    """Shared prompts come from their own generator: the requests' own draws (own text, outputs,
    stops, aborts, acceptance) and the engine settings but the lengths that follow the longest
    request are what the seed drew before."""
    drawn = {key: explore_workload(*key) for key in DRAWS}
    monkeypatch.setattr(generators, "draw_shared_prompts", lambda rng, requests, block_size, seed: (requests, ()))
    own = ("request_id", "prompt_len", "max_tokens", "stop_at", "acceptance")
    sized = ("max_model_len", "num_blocks")  # follow the longest request, which a shared prompt lengthens
    for key, w in drawn.items():
        before = explore_workload(*key)
        assert [[getattr(r, f) for f in own] for r in w.requests] == [
            [getattr(r, f) for f in own] for r in before.requests
        ]
        assert [r.abort_step for r in w.requests if r.follows is None] == [
            r.abort_step for r, now in zip(before.requests, w.requests) if now.follows is None
        ]
        changed = {f for f in w.config.to_dict() if getattr(w.config, f) != getattr(before.config, f)}
        assert changed <= set(sized), key


def test_the_random_scenario_draws_no_shared_prompts():
    for seed in range(40):
        w = random_workload(seed)
        assert not w.prefixes and not any(r.prefix or r.follows for r in w.requests)


def test_sglang_s_shape_gives_every_turn_a_fixed_step():
    shaped = 0
    for seed, profiles in DRAWS:
        w = explore_workload(seed, profiles)
        if not any(r.after_finish for r in w.requests):
            continue
        taken = taken_by_sglang(w)
        refuse_workload(taken)  # nothing SGLang's scheduler refuses
        arrival = {r.request_id: r.arrival_step for r in taken.requests}
        for before, after in zip(w.requests, taken.requests):
            assert (after.follows, after.prompt_len) == (before.follows, before.prompt_len)
            if before.after_finish is not None:
                assert after.after_finish is None
                assert after.arrival_step == arrival[before.follows] + before.after_finish
        shaped += 1
    assert shaped
