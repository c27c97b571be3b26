"""replay/families/vllm/recorded_inputs.py, and what it feeds: an attached run's recorded inputs as
the prompts, chunks and stop tokens a replay hands its engine; the workload summary merge.py
builds of them (abort placement, per-life max_tokens, the end of a stream); the engine loop
stepping where the recorded engine announced finished requests.

CPU only: the recordings are reference runs given recorded inputs by hand. The attached vLLM
programs that record real ones are in tests/replay/engines (test_attached.py,
test_serve_recording.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from specreplay.replay.engines.inputs import InputDriver
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.outcomes import RecordedOracle
from specreplay.replay.families.vllm.recorded_inputs import RecordedInputs
from specreplay.replay.impls import resolve
from specreplay.replay.workflows.merge import abort_event, workload_of
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.oracle import ReplayContext
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError

UPSTREAM = resolve("upstream", allow_import=False)


def workload(*requests: dict, events: tuple[dict, ...] = (), **top) -> Workload:
    """A workload from one-line request dicts (id, arrival_step, prompt_len, max_tokens, ...)."""
    doc = {"seed": 3, "max_steps": 200, "config": {"max_num_seqs": 4}, **top}
    return Workload.from_dict({**doc, "requests": list(requests), "events": list(events)})


def life(rid: str, prompt: list[int], step: int = 1, max_tokens: int = 6, **params) -> dict:
    """One request life as the input observer writes it."""
    return {
        "id": rid,
        "life": 0,
        "step": step,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": 0,
        "stop_token_ids": params.get("stop_token_ids", []),
        "ignore_eos": params.get("ignore_eos", True),
        "streaming": False,
    }


def inputs(*requests: dict, chunks: tuple[dict, ...] = ()) -> dict:
    return {"requests": list(requests), "chunks": list(chunks), "aborts": [], "events": []}


@pytest.fixture(scope="module")
def stopped():
    """A reference run in which request "s" stops on a stop token at its 3rd output."""
    w = workload(
        {"id": "s", "prompt_len": 4, "max_tokens": 8, "stop_at": 3},
        {"id": "n", "prompt_len": 5, "max_tokens": 4},
    )
    trace = run_workload(w, UPSTREAM)
    df = trace.table.to_pandas()
    row = df[(df.request_id == "s") & (df.apply_finish_reason == "stop")].iloc[0]
    token = int(list(row.apply_sampled_token_ids)[int(row.apply_num_tokens) - 1])
    return w, trace, token


# ---------------------------------------------------------------------------- prompts and chunks
def test_the_oracle_hands_out_the_recorded_prompts(stopped):
    w, trace, token = stopped
    recorded = inputs(life("s", [9, 8, 7, 6], stop_token_ids=[token]), life("n", [1, 2, 3, 4, 5]))
    oracle = RecordedOracle(w, trace.table, inputs=RecordedInputs.of(recorded, trace.table))
    assert oracle.prompt("s") == [9, 8, 7, 6] and oracle.prompt("n") == [1, 2, 3, 4, 5]
    # The model's sequence starts from them, so the prompt the engine is fed is a right input.
    assert oracle.expected("s")[:4] == [9, 8, 7, 6]
    # Without recorded inputs: the workload's seeded prompts.
    assert RecordedOracle(w, trace.table).prompt("s") != [9, 8, 7, 6]


def test_a_prompt_of_another_length_than_the_workload_says_is_the_synthetic_one(stopped):
    """A shrunk candidate's shorter prompt: the recorded one no longer fits it."""
    w, trace, token = stopped
    recorded = inputs(life("s", [9, 8, 7, 6, 5], stop_token_ids=[token]), life("n", [1, 2, 3, 4, 5]))
    given = RecordedInputs.of(recorded, trace.table)
    assert given.prompt("s", 4) is None and given.prompt("n", 5) == [1, 2, 3, 4, 5]


def test_streaming_chunks_are_the_recorded_ones_and_the_end_of_a_stream_is_none():
    w = workload(
        {"id": "x", "prompt_len": 3, "max_tokens": 2, "streaming": True},
        events=({"step": 3, "kind": "stream_append", "request": "x", "tokens": 2},),
    )
    trace = run_workload(w, UPSTREAM)
    recorded = inputs(
        {**life("x", [4, 5, 6], max_tokens=2), "streaming": True},
        chunks=(
            {"id": "x", "life": 0, "step": 3, "prompt": [7, 8], "max_tokens": 2, "end": False},
            {"id": "x", "life": 0, "step": 5, "prompt": [0], "max_tokens": 1, "end": True},
        ),
    )
    given = RecordedInputs.of(recorded, trace.table)
    assert given.chunks == {"x": [(7, 8)]}
    oracle = RecordedOracle(w, trace.table, inputs=given)
    assert oracle.chunk("x", 1) == [7, 8]


# ---------------------------------------------------------------------------- stop tokens
def test_the_stop_token_is_the_one_the_life_stopped_on(stopped):
    w, trace, token = stopped
    # Stop set {token, 999}: the recorded outputs reached `token` only.
    given = RecordedInputs.of(inputs(life("s", [1, 2, 3, 4], stop_token_ids=[999, token])), trace.table)
    assert given.stop_token("s") == token
    # EOS (ignore_eos false) is not recorded: a "stop" on a token outside stop_token_ids was EOS.
    eos = RecordedInputs.of(inputs(life("s", [1, 2, 3, 4], ignore_eos=False)), trace.table)
    assert eos.stop_token("s") == token


def test_a_life_that_never_stopped_gets_its_first_stop_token_id(stopped):
    w, trace, token = stopped
    given = RecordedInputs.of(
        inputs(life("s", [1, 2, 3, 4], stop_token_ids=[token]), life("n", [1, 2, 3, 4, 5], stop_token_ids=[5, 6])),
        trace.table,
    )
    assert given.stop_token("n") == 5
    assert RecordedInputs.of(inputs(life("n", [1, 2, 3, 4, 5])), trace.table).stop_token("n") is None


def test_a_replay_on_recorded_inputs_stops_where_the_recording_did(stopped):
    w, trace, token = stopped
    recorded = inputs(life("s", [1, 2, 3, 4], stop_token_ids=[token]), life("n", [1, 2, 3, 4, 5]))
    oracle = RecordedOracle(w, trace.table, inputs=RecordedInputs.of(recorded, trace.table))
    replayed = run_workload(w, UPSTREAM, oracle=oracle)
    columns = [c for c in trace.table.column_names if c.startswith(("sched_", "step_", "apply_", "worker_"))]
    assert replayed.table.select(columns).equals(trace.table.select(columns))


# ---------------------------------------------------------------------------- refused in one line
@pytest.mark.parametrize(
    "bad, says",
    [
        ({"requests": "x"}, "a list of requests"),
        (inputs({**life("s", [1, 2, 3, 4]), "prompt": [1, -2]}), "requests[0]: prompt: expected a list of token ids"),
        (inputs({**life("s", [1, 2, 3, 4]), "max_tokens": None}), "requests[0]: max_tokens"),
        (inputs({**life("s", [1, 2, 3, 4]), "ignore_eos": "yes"}), "ignore_eos must be true or false"),
        (inputs(life("s", [1, 2, 3, 4]), {**life("s", [4, 3, 2, 1], step=9), "life": 1}), "another prompt"),
    ],
)
def test_bad_recorded_inputs_are_one_line(stopped, bad, says):
    _, trace, _ = stopped
    with pytest.raises(InputError) as err:
        RecordedInputs.of(bad, trace.table, "t.parquet: inputs")
    assert says in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("t.parquet: inputs")


def test_a_stop_its_sampling_parameters_cannot_explain_is_refused(stopped):
    _, trace, token = stopped
    with pytest.raises(InputError, match=f"stopped at step .* on token {token}, which its recorded sampling"):
        RecordedInputs.of(inputs(life("s", [1, 2, 3, 4], stop_token_ids=[999], ignore_eos=True)), trace.table)


# ---------------------------------------------------------------------------- the workload summary
def test_an_abort_lands_where_its_row_says():
    """Recorded at step 8 (schedule() calls before it): from the input queue, step 9's row carries
    the abort event; from the early-aborts queue, it landed after step 8's schedule()."""
    abort = {"id": "r", "life": 0, "step": 8, "status": "FINISHED_ABORTED"}
    assert abort_event(abort, 1, {(9, "r")}) == {"step": 9, "kind": "abort", "request": "r"}
    assert abort_event(abort, 1, set()) == {"step": 8, "kind": "abort", "request": "r", "when": "after"}
    # Aborted before its first schedule(): at its arrival step.
    assert abort_event({**abort, "step": 2}, 3, set()) == {"step": 3, "kind": "abort", "request": "r"}


def test_the_summary_carries_each_life_s_max_tokens_and_no_end_of_stream_chunk():
    recorded = {
        "requests": [
            life("r", [1, 2, 3], step=1, max_tokens=4),
            {**life("r", [1, 2, 3], step=9, max_tokens=7), "life": 1},
            {**life("x", [4, 5], step=2, max_tokens=3), "streaming": True},
        ],
        "chunks": [
            {"id": "x", "life": 0, "step": 6, "prompt": [6, 7], "max_tokens": 3, "end": False},
            {"id": "x", "life": 0, "step": 8, "prompt": [0], "max_tokens": 1, "end": True},
        ],
        "aborts": [{"id": "r", "life": 0, "step": 2, "status": "FINISHED_ABORTED"}],
        "events": [],
    }
    rows = [{"step": 3, "request_id": "r", "sched_event": "abort"}]
    w = workload_of(recorded, EngineConfig(), "run", 12, rows)
    assert [e.to_dict() for e in w.events] == [
        {"step": 3, "kind": "abort", "request": "r"},
        {"step": 6, "kind": "stream_append", "request": "x", "tokens": 2, "max_tokens": 3},
        {"step": 9, "kind": "resubmit", "request": "r", "max_tokens": 7},
    ]
    assert Workload.from_dict(w.to_dict()) == w
    driver = InputDriver(w, RecordedOracle(w, run_workload(w, UPSTREAM).table))
    r = driver.spec_of["r"]
    assert driver.submit(r)[1] == 4 and driver.submit(r)[1] == 7  # each life its own max_tokens


def test_a_resubmit_s_max_tokens_must_fit():
    with pytest.raises(InputError, match=r"events\[0\]: prompt_len \+ max_tokens = 2052 exceeds max_model_len"):
        workload(
            {"id": "r", "prompt_len": 4, "max_tokens": 4},
            events=({"step": 9, "kind": "resubmit", "request": "r", "max_tokens": 2048},),
        )


# ---------------------------------------------------------------------------- the engine loop
# A recording whose engine stopped once nothing was left to feed or schedule.
STOPS_WHEN_IDLE = ReplayContext(drains_at_end=False)


def test_a_replay_steps_where_the_recorded_engine_announced_finished_requests():
    """vLLM's engine core schedules once more after its last request finishes (has_requests()
    counts finished ids until a schedule() announces them), and so do the models; then the engine
    idles to the next arrival. A replay told where the recorded engine announced steps there too."""
    w = workload({"id": "a", "prompt_len": 4, "max_tokens": 3}, {"id": "b", "arrival_step": 12, "prompt_len": 4})
    trace = run_workload(w, UPSTREAM)
    df = trace.table.to_pandas()
    a = df[df.request_id == "a"]
    done = int(a[a.apply_finish_reason == "length"].apply_step.item())  # the iteration a finished in
    for ran in (df, None):
        if ran is None:
            given = RecordedInputs({}, {}, {}, frozenset({done + 1}))
            oracle = RecordedOracle(w, trace.table, inputs=given, context=STOPS_WHEN_IDLE)
            ran = run_workload(w, UPSTREAM, oracle=oracle).table.to_pandas()
        announce = ran[ran.step == done + 1]
        assert announce.request_id.tolist() == ["a"] and announce.sched_finished_announced.tolist() == [True]
        assert sorted(set(ran.step)) == [*range(1, done + 2), *range(12, int(ran.step.max()) + 1)]  # idle between
        assert ran[ran.request_id == "b"].step.min() == 12


def test_a_run_that_ends_at_its_last_step_completed():
    """A recording's summary ends at its last step: a replay that runs out of work there completed."""
    w = workload({"id": "a", "prompt_len": 4, "max_tokens": 3})
    trace = run_workload(w, UPSTREAM)
    last = dataclasses.replace(w, max_steps=trace.num_steps)
    oracle = RecordedOracle(last, trace.table, context=STOPS_WHEN_IDLE)
    assert run_workload(last, UPSTREAM, oracle=oracle).outcome.status == "completed"
    cut = dataclasses.replace(w, max_steps=trace.num_steps - 1)
    assert run_workload(cut, UPSTREAM).outcome.to_dict() == {"status": "step_limit", "step": trace.num_steps - 1}
