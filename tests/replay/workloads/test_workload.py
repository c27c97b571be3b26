"""The workload file (replay/workloads/workload.py, request_spec.py): real prompts (explicit ids, a
shared prefix, a conversation's next turn), acceptance listed per verification round. Every field
survives `to_dict`/`from_dict` (a trace stores its workload and `replay`/`gate` read it back), a
workload written before them reads and writes as before, and bad input is one InputError line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specreplay.replay.workloads.scenarios import SCENARIOS, build_scenario
from specreplay.replay.workloads.workload import Prefix, Workload, load_workload
from specreplay.traces.errors import InputError
from tests.replay.workloads.strategies import workloads

CORPUS = Path(__file__).resolve().parents[3] / "replay" / "corpus"

#: The file of docs/workloads.md's example, its new fields.
TOML = """
name = "mine"
seed = 7
[prefixes]
system = 48
doc = [5, 9, 2]
[[requests]]
id = "0"
prompt_len = 3
max_tokens = 12
stop_at = 4
acceptance = [2, 0, 3]
[[requests]]
id = "1"
prompt = [7, 1, 4, 4]
prefix = "system"
[[requests]]
id = "2"
follows = "0"
after_finish = 2
prompt_len = 5
[[requests]]
id = "3"
follows = "2"
arrival_step = 9
prompt_len = 1
"""


def test_the_documented_file_reads_as_written(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(TOML)
    workload = load_workload(path)
    assert workload.prefixes == (Prefix("system", 48), Prefix("doc", ids=(5, 9, 2)))
    r0, r1, r2, r3 = workload.requests
    assert r0.acceptance == (2, 0, 3) and r0.prompt_len == 3
    assert r1.prompt == (7, 1, 4, 4) and r1.prompt_len == 4 and r1.prefix == "system"
    assert (r2.follows, r2.after_finish) == ("0", 2)
    assert (r3.follows, r3.after_finish, r3.arrival_step) == ("2", None, 9)  # an arrival step: no after_finish
    answer0 = 4  # stop_at 4: at most 4 outputs, fewer when the stop token comes earlier
    assert workload.prompt_len_of("1") == 52
    assert workload.prompt_len_of("2") <= 3 + answer0 + 5
    assert workload.prompt_len_of("3") == workload.prompt_len_of("2") + 16 + 1  # "2" has no stop: all 16


def test_a_follow_up_with_no_arrival_comes_the_step_after_the_one_it_follows_finished():
    got = Workload.from_dict({"requests": [{"id": "a"}, {"id": "b", "follows": "a"}]})
    assert got.requests[1].after_finish == 1


@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - {"shared-prefix"}))  # that one shares prompts
def test_a_workload_without_the_new_fields_writes_what_it_wrote(name):
    """No new key in the dict of an old-style workload: its trace metadata stays byte for byte."""
    data = build_scenario(name).to_dict()
    assert "prefixes" not in data
    for item in data["requests"]:
        assert list(item)[:4] == ["id", "arrival_step", "prompt_len", "max_tokens"]
        assert not {"prompt", "prefix", "follows", "after_finish"} & set(item)


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.parquet")), ids=lambda p: p.name)
def test_the_shipped_goldens_workloads_read_and_write_back_unchanged(path):
    from specreplay.traces.io import read_trace

    stored = read_trace(path).workload.to_dict()
    again = Workload.from_dict(stored, path.name).to_dict()
    # The engine config gains the settings added since (their defaults): the rest is as stored.
    assert {key: value for key, value in again.items() if key != "config"} == {
        key: value for key, value in stored.items() if key != "config"
    }


# ---------------------------------------------------------------------- round trip
def file_workloads():
    """Workloads with every new field: explicit prompts, prefixes (seeded and given), turns (at a
    fixed step or after the finish of one listed before), acceptance lists, small vocabularies."""
    return workloads(vocabs=(16, 512))


@settings(max_examples=150, deadline=None)
@given(file_workloads())
def test_every_field_survives_a_round_trip_through_the_file_format(workload):
    data = workload.to_dict()
    again = Workload.from_dict(json.loads(json.dumps(data)))
    assert again == workload
    assert again.to_dict() == data
    assert [again.prompt_len_of(r.request_id) for r in again.requests] == [
        len(workload.prompts.of(r.request_id)) for r in workload.requests
    ]


# ---------------------------------------------------------------------- refusals
BASE = {"requests": [{"id": "a", "prompt_len": 4, "max_tokens": 4}]}


def with_request(**fields) -> dict:
    return {**BASE, "requests": [*BASE["requests"], {"id": "b", **fields}]}


@pytest.mark.parametrize(
    "data, message",
    [
        (with_request(prompt=[]), "non-empty list of token ids"),
        (with_request(prompt=[1, 512]), r"token id 512 is outside the vocabulary \[0, 512\)"),
        (with_request(prompt=[1, -1]), "must be >= 0"),
        (with_request(prompt=[1, 2], prompt_len=3), "prompt_len 3 is not the 2 ids of prompt"),
        (with_request(prefix="sys"), "prefix 'sys' is not in the workload's \\[prefixes\\] \\(known: none\\)"),
        ({**with_request(prefix="x"), "prefixes": {"sys": 4}}, "prefix 'x' is not in .* \\(known: sys\\)"),
        ({**BASE, "prefixes": {"sys": 0}}, "prefixes: sys: must be >= 1"),
        ({**BASE, "prefixes": {"sys": [600]}}, "outside the vocabulary"),
        ({**BASE, "prefixes": [1, 2]}, "prefixes: expected a table"),
        (with_request(follows="zz"), "follows 'zz', which is not a request listed before it"),
        ({"requests": [{"id": "b", "follows": "a"}, {"id": "a"}]}, "not a request listed before it"),
        (with_request(follows="b"), "not a request listed before it"),
        ({**with_request(follows="a", prefix="sys"), "prefixes": {"sys": 4}}, "give prefix or follows, not both"),
        (with_request(after_finish=2), "after_finish needs follows"),
        (with_request(follows="a", after_finish=2, arrival_step=3), "give arrival_step or after_finish, not both"),
        (with_request(follows="a", after_finish=0), "after_finish: must be >= 1"),
        (with_request(follows="a", abort_step=4), "arriving after_finish takes no abort_step"),
        (with_request(follows="a", streaming=True), "arriving after_finish is not streaming"),
        (
            {"requests": [{"id": "a", "streaming": True}, {"id": "b", "follows": "a", "arrival_step": 3}]},
            "which is a streaming session",
        ),
        (
            {"requests": [{"id": "a", "abort_step": 3}, {"id": "b", "follows": "a"}]},
            "which is aborted \\(abort_step\\)",
        ),
        (
            {**with_request(follows="a"), "events": [{"step": 3, "kind": "abort", "request": "a"}]},
            "is followed by 'b'.* aborting it is not supported",
        ),
        (
            {**with_request(follows="a"), "events": [{"step": 3, "kind": "abort", "request": "b"}]},
            "arrives after_finish .* give it an arrival_step",
        ),
        (with_request(acceptance=[]), "or the drafts accepted per verification round"),
        (
            with_request(acceptance=[1, 4]),
            r"acceptance\[1\]: 4 drafts accepted in a round of at most num_spec_tokens = 3",
        ),
        (with_request(acceptance=[1, True]), r"acceptance\[1\]: expected an integer"),
        (with_request(acceptance=7), "expected a rule like 'all'"),
        (with_request(acceptance=[1], streaming=True), "a streaming request takes an acceptance rule, not a list"),
        (
            {"requests": [{"id": "a", "max_tokens": 300}, {"id": "b", "follows": "a", "prompt_len": 200}]},
            r"its whole prompt \(508 tokens\) \+ max_tokens = 524 exceeds max_model_len 512",
        ),
        ({**with_request(prefix="sys", prompt_len=10), "prefixes": {"sys": 500}}, "its whole prompt \\(510 tokens\\)"),
        ({"requests": [{"id": "a", "input_embeds": "yes"}]}, "input_embeds must be true or false"),
        (
            {"requests": [{"id": "a", "input_embeds": True, "prompt": [3, 4]}]},
            "an input_embeds request sends embeddings, not ids: it takes prompt_len, not prompt",
        ),
        (
            {"requests": [{"id": "a", "input_embeds": True, "streaming": True}]},
            "it takes prompt_len, not streaming",
        ),
    ],
)
def test_bad_input_is_one_input_error_line(data, message):
    with pytest.raises(InputError, match=message) as caught:
        Workload.from_dict(data)
    assert "\n" not in str(caught.value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**31) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["prompt", "prefix", "follows", "after_finish", "acceptance"]), JSON, max_size=3),
    JSON,
)
def test_any_value_of_the_new_keys_reads_or_is_one_input_error_line(fields, prefixes):
    data = {**with_request(**fields), "prefixes": prefixes}
    try:
        workload = Workload.from_dict(data)
    except InputError as exc:
        assert "\n" not in str(exc)
    else:
        assert Workload.from_dict(workload.to_dict()) == workload
