"""The one-line workload notation (replay/workloads/notation.py): each mark builds what the
workload's own constructors build, bad text is one InputError line, and every scenario survives
a round trip through `notation_of`."""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.notation import CONFIG_KEYS, FLAG_WORDS, notation_of, workload_from_notation
from specreplay.replay.workloads.scenarios import SCENARIOS, build_scenario
from specreplay.replay.workloads.workload import Event, Prefix, RequestSpec, Workload
from specreplay.traces.errors import InputError
from tests.replay.workloads.strategies import workloads


def test_the_issue_s_example_reads_as_written():
    assert workload_from_notation("a:p20,t4 b:p8@3 | budget 40 k3 async") == Workload(
        (RequestSpec("a", 1, 20, 4), RequestSpec("b", 3, 8)),
        EngineConfig(max_num_batched_tokens=40, num_spec_tokens=3, async_scheduling=True),
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a", Workload((RequestSpec("a"),))),
        ("a:t4@2", Workload((RequestSpec("a", arrival_step=2, max_tokens=4),))),
        ("x:p4,t20,stop2", Workload((RequestSpec("x", 1, 4, 20, stop_at=2),))),
        ("a:p4,t30,abort5 b:p4,t30", Workload((RequestSpec("a", 1, 4, 30, abort_step=5), RequestSpec("b", 1, 4, 30)))),
        (
            "a:p5,t20,random:0.3 b:none",
            Workload((RequestSpec("a", 1, 5, 20, acceptance="random:0.3"), RequestSpec("b", acceptance="none"))),
        ),
        ("0-2:p3,t12", Workload(tuple(RequestSpec(str(i), 1, 3, 12) for i in range(3)))),
        ("a | sync k2", Workload((RequestSpec("a"),), EngineConfig(num_spec_tokens=2, async_scheduling=False))),
        (
            "a | budget 32 seqs 8 k3 block 32 blocks 64 len 256 threshold 8 lookahead 4 vocab 100 vllm 0.33.0",
            Workload(
                (RequestSpec("a"),),
                EngineConfig(
                    max_num_batched_tokens=32,
                    max_num_seqs=8,
                    block_size=32,
                    num_blocks=64,
                    max_model_len=256,
                    long_prefill_token_threshold=8,
                    num_lookahead_tokens=4,
                    vocab_size=100,
                    vllm_version="0.33.0",
                ),
            ),
        ),
        ("a | budget16 k 0", Workload((RequestSpec("a"),), EngineConfig(max_num_batched_tokens=16, num_spec_tokens=0))),
        (
            "a | alternate seed 7 steps 15 name one",
            Workload((RequestSpec("a"),), acceptance="alternate", seed=7, max_steps=15, name="one"),
        ),
    ],
)
def test_each_mark_builds_what_the_constructors_build(text, expected):
    assert workload_from_notation(text) == expected


#: The lines the tests now write (tests/replay/models/test_scheduler.py, test_runner.py,
#: test_scheduler_hooks.py, tests/replay/workloads/test_oracle.py), each beside the positional
#: construction it replaced.
CONVERTED = [
    (
        "0:p5,t20,all 1:p6,t20,none 2:p7,t20,alternate 3:p8,t20,random:0.3 4:p9,t20,random:0.7 | name batched",
        Workload(
            tuple(
                RequestSpec(str(i), 1, 5 + i, 20, acceptance=a)
                for i, a in enumerate(("all", "none", "alternate", "random:0.3", "random:0.7"))
            ),
            EngineConfig(),
            name="batched",
        ),
    ),
    ("0-10:p3,t12", Workload(tuple(RequestSpec(str(i), 1, 3, 12) for i in range(11)), acceptance="all")),
    (
        "a:p20,t4 b:p5,t4 | budget 16 k2 threshold 8",
        Workload(
            (RequestSpec("a", 1, 20, 4), RequestSpec("b", 1, 5, 4)),
            EngineConfig(max_num_batched_tokens=16, num_spec_tokens=2, long_prefill_token_threshold=8),
        ),
    ),
    ("a:p3,t1 | k0", Workload((RequestSpec("a", 1, 3, 1),), EngineConfig(num_spec_tokens=0))),
    ("a:p4,t20,stop2 | k0", Workload((RequestSpec("a", 1, 4, 20, stop_at=2),), EngineConfig(num_spec_tokens=0))),
    (
        "0-5:p20,t30 | budget 40 k3 block 16 blocks 12 steps 15",
        Workload(
            tuple(RequestSpec(str(i), 1, 20, 30) for i in range(6)),
            EngineConfig(max_num_batched_tokens=40, num_spec_tokens=3, block_size=16, num_blocks=12),
            max_steps=15,
        ),
    ),
    (
        "0-5:p20,t30 | budget 40 k3 block 16 blocks 12 steps 9",
        Workload(
            tuple(RequestSpec(str(i), 1, 20, 30) for i in range(6)),
            EngineConfig(max_num_batched_tokens=40, num_spec_tokens=3, block_size=16, num_blocks=12),
            max_steps=9,
        ),
    ),
    (
        "0:p3,t12 1:p1,t5@3 | k3",
        Workload((RequestSpec("0", 1, 3, 12), RequestSpec("1", 3, 1, 5)), EngineConfig(num_spec_tokens=3)),
    ),
    (
        "a:p4,t30,abort5 b:p4,t30 | k2",
        Workload(
            (RequestSpec("a", 1, 4, 30, abort_step=5), RequestSpec("b", 1, 4, 30)), EngineConfig(num_spec_tokens=2)
        ),
    ),
    (
        "a:p5,t12 | k3 alternate",
        Workload((RequestSpec("a", 1, 5, 12),), EngineConfig(num_spec_tokens=3), acceptance="alternate"),
    ),
    (
        "0:p40,t24 1:p3,t40 | len 64 k3",
        Workload(
            (RequestSpec("0", 1, 40, 24), RequestSpec("1", 1, 3, 40)),
            EngineConfig(max_model_len=64, num_spec_tokens=3),
            acceptance="all",
        ),
    ),
    (
        "a:p4,t12 | alternate name one",
        Workload(requests=(RequestSpec("a", prompt_len=4, max_tokens=12),), acceptance="alternate", name="one"),
    ),
]


@pytest.mark.parametrize("text, built", CONVERTED, ids=[text for text, _ in CONVERTED])
def test_the_converted_tests_build_the_workloads_they_built_by_hand(text, built):
    assert workload_from_notation(text) == built


def test_events_build_the_workload_file_s_events():
    got = workload_from_notation(
        "a:p4,t40 s:p6,t6,stream | | pause@6:wait,noclear resume@9 reset@14:running "
        "abort(a)@5:after resubmit(a)@20:t5 append(s)@3:p4,t5"
    )
    assert got.requests[1] == RequestSpec("s", 1, 6, 6, streaming=True)
    assert got.events == (
        Event(6, "pause", mode="wait", clear_cache=False),
        Event(9, "resume"),
        Event(14, "reset_prefix_cache", reset_running=True),
        Event(5, "abort", request="a", when="after"),
        Event(20, "resubmit", request="a", max_tokens=5),
        Event(3, "stream_append", request="s", tokens=4, max_tokens=5),
    )


@pytest.mark.parametrize("name, seed", [(name, 0) for name in SCENARIOS] + [("random", seed) for seed in range(1, 40)])
def test_every_scenario_survives_a_round_trip(name, seed):
    workload = build_scenario(name, seed)
    text = notation_of(workload)
    assert workload_from_notation(text) == workload, text
    assert "\n" not in text


def test_the_written_form_is_short_and_names_only_what_differs():
    assert notation_of(build_scenario("reentry")) == "0:p3,t4 1-10:p3,t12 | steps 200 name reentry"
    assert notation_of(Workload((RequestSpec("a", 3, 20, 4),))) == "a:p20,t4@3"


def test_every_engine_setting_has_a_key():
    """A new EngineConfig field must get a key, or notation_of would drop it."""
    flags = {name for name, _ in FLAG_WORDS.values()}
    assert {f.name for f in fields(EngineConfig)} == {*CONFIG_KEYS.values(), *flags}


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "names no request"),
        ("a | | | x", "at most three parts"),
        (":p4", "has no request id"),
        ("a:q4", "unknown field 'q4'"),
        ("a:p4,p5", "gives 'p5' twice"),
        ("a:p4@x", "@ takes a whole number"),
        ("3-1:p4", "runs backwards"),
        ("a | turbo", "unknown setting 'turbo'"),
        ("a | budget", "setting 'budget' needs a value"),
        ("a | budget forty", "setting 'budget' takes a whole number"),
        ("a | k2 k3", "given twice"),
        ("a | | explode@3", "unknown kind 'explode'"),
        ("a | | pause", "is not KIND"),
        ("a | | resume@4:wait", "resume takes no option 'wait'"),
        ("a a", "duplicate id 'a'"),  # what the workload file's own checks say
        ("a:p600", "exceeds max_model_len"),
        ("a | | pause@3", "has no later resume"),
        ("a | | abort(b)@3", "must name a request of the workload"),
        ("a | vllm 9.9", "is not modelled"),
    ],
)
def test_bad_text_is_one_input_error_line(text, message):
    with pytest.raises(InputError, match=message) as caught:
        workload_from_notation(text)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("workload notation")


@pytest.mark.parametrize("rid", ["a b", "a:b", "x,y", "a@1", "f(x)"])
def test_what_the_notation_cannot_spell_is_refused(rid):
    with pytest.raises(InputError, match="cannot spell the request id"):
        notation_of(Workload((RequestSpec(rid),)))


# ---------------------------------------------------------------------- real prompts
@pytest.mark.parametrize(
    "text, expected",
    [
        ("a:prompt=7.1.4,t3", Workload((RequestSpec("a", max_tokens=3, prompt=(7, 1, 4)),))),
        ("a:t5,accept=2.0.3", Workload((RequestSpec("a", max_tokens=5, acceptance=(2, 0, 3)),))),
        (
            "a:prefix=sys,p5 | prefix sys=p40",
            Workload((RequestSpec("a", prompt_len=5, prefix="sys"),), prefixes=(Prefix("sys", 40),)),
        ),
        (
            "a:prefix=doc | prefix doc=3.2.1",
            Workload((RequestSpec("a", prefix="doc"),), prefixes=(Prefix("doc", ids=(3, 2, 1)),)),
        ),
        ("a b:follows=a", Workload((RequestSpec("a"), RequestSpec("b", follows="a", after_finish=1)))),
        ("a b:follows=a@+3", Workload((RequestSpec("a"), RequestSpec("b", follows="a", after_finish=3)))),
        ("a b:follows=a@1", Workload((RequestSpec("a"), RequestSpec("b", follows="a")))),
        ("a | noapc", Workload((RequestSpec("a"),), EngineConfig(enable_prefix_caching=False))),
        ("a | blockdrop", Workload((RequestSpec("a"),), EngineConfig(eagle_block_drop=True))),
    ],
)
def test_the_marks_for_real_prompts_build_what_the_constructors_build(text, expected):
    assert workload_from_notation(text) == expected
    assert workload_from_notation(notation_of(expected)) == expected


def test_the_written_form_of_a_conversation():
    workload = workload_from_notation("q0:p5,t6,prefix=sys q1:follows=q0,p4,t5@+2 q2:follows=q0,p1@7 | prefix sys=p20")
    assert notation_of(workload) == (
        "q0:p5,t6,prefix=sys q1:p4,t5,follows=q0@+2 q2:p1,t16,follows=q0@7 | prefix sys=p20"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("a:prompt=", "unknown field 'prompt='"),
        ("a:prompt=1.x", "prompt= takes a whole number, got 'x'"),
        ("a:prompt=1.2,p4", "gives 'p4' twice \\(or a prompt and pN\\)"),
        ("a:accept=1..2", "accept= takes a whole number, got ''"),
        ("a:accept=9", "9 drafts accepted in a round of at most num_spec_tokens = 3"),
        ("a:prefix=sys", "prefix 'sys' is not in the workload's"),
        ("a:follows=b b", "not a request listed before it"),
        ("a b:follows=a@+x", "@\\+ takes a whole number"),
        ("a b:p3@+2", "after_finish needs follows"),
        ("a | prefix", "setting 'prefix' needs NAME=pN or NAME=ID.ID"),
        ("a | prefix sys", "prefix 'sys' is not NAME=pN or NAME=ID.ID"),
        ("a | prefix sys=p4 prefix sys=p5", "prefix 'sys' given twice"),
        ("a | prefix sys=px", "prefix 'sys': p takes a whole number"),
        ("a | apc noapc", "given twice"),
    ],
)
def test_bad_real_prompt_marks_are_one_input_error_line(text, message):
    with pytest.raises(InputError, match=message) as caught:
        workload_from_notation(text)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("workload notation")


def test_a_prefix_name_the_notation_cannot_spell_is_refused():
    workload = Workload((RequestSpec("a", prefix="x=y"),), prefixes=(Prefix("x=y", 4),))
    with pytest.raises(InputError, match="cannot spell the prefix name 'x=y'"):
        notation_of(workload)


_IDS = st.text(alphabet="abcxyz019", min_size=1, max_size=3)


def notated_workloads():
    """Workloads the notation can spell, with every request field, prefixes, turns and flags."""
    return workloads(ids=_IDS, engine_flags=True)


@settings(max_examples=200, deadline=None)
@given(notated_workloads())
def test_every_workload_the_notation_spells_survives_a_round_trip(workload):
    workload = Workload.from_dict(workload.to_dict())  # a valid workload file, first
    text = notation_of(workload)
    assert workload_from_notation(text) == workload, text
