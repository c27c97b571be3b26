"""`specreplay record --attach` on a real vLLM 0.34.0 `vllm serve` on a CPU, with real clients, in
0.34.0's own environment (scripts/vllm-0.34.sh test). The user's command as they would run it on
this machine: vLLM's CUDA wheel told its device (VLLM_TARGET_DEVICE=cpu), nothing set about the
runner (0.34.0 has Model Runner V2 only) and no Triton interpreter: `record --attach` turns that on
for the command, and the recorder's plugin applies the CPU stand-ins in every process.

Held: every request the clients sent is in the trace under its own id, the tokens the scheduler
applied are the tokens each client received (a disconnected client's as far as it read), the
trace names the 0.34 MRV2 runner and the patches, the checker finds nothing, and the recording
replays step for step through the reference MRV2 with 0.34.0's rules.
"""

from __future__ import annotations

import signal

import pytest

from specreplay.replay.families.vllm.setup import installed_vllm_version
from tests.live_serve import plan_openai_requests, run_openai_clients
from tests.replay.engines.test_serve_recording import applied_tokens, attached_server, server_env, whole_on_record

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(installed_vllm_version() != "0.34.0", reason="vLLM 0.34.0's environment: scripts/vllm-0.34.sh"),
]


def users_environment() -> dict[str, str]:
    """The harness's server environment as a 0.34 user on this machine has it: nothing about the
    runner, and the CUDA wheel told its device (it cannot tell the platform without a GPU)."""
    env = server_env()
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


def test_an_attached_0_34_server_records_its_clients_and_replays_step_for_step(tmp_path):
    from click.testing import CliRunner

    from specreplay.cli.main import main
    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.families.vllm.mrv2 import cpu_ops, cpu_triton
    from specreplay.traces.io import read_trace

    output = tmp_path / "serve.parquet"
    with attached_server(tmp_path, output, env=users_environment()) as server:
        server.wait_ready()
        clients = run_openai_clients(server, plan_openai_requests(8, 2), timeout=300)
        assert sum(c.aborted for c in clients) >= 2
        assert server.wait_idle(120), "the engine did not go idle after the clients"
        assert whole_on_record(output, 120), "the worker never returned the last scheduled step"
        stopped = server.stop(signal.SIGINT, timeout=180)
    log = server.log_text()
    assert stopped.returncode == 0 and "merged run" in log, log[-3000:]

    trace = read_trace(output)
    assert trace.config.vllm_version == "0.34.0" and trace.impl.models == "vllm 0.34.0"
    assert trace.impl.runner.endswith("cpu.model_runner.CPUModelRunner") and trace.impl.runner_family == "v2"
    assert {*cpu_ops.PATCHES, *cpu_triton.PATCHES} <= set(trace.impl.patches)
    df = trace.table.to_pandas()
    assert {c.request_id for c in clients} <= {r["id"] for r in trace.inputs.requests}
    for c in clients:
        got = applied_tokens(df, c.request_id)
        assert got == c.token_ids if not c.aborted else got[: len(c.token_ids)] == c.token_ids, c.request_id
    assert not [f for f in check_trace(trace) if f.severity == "error"]

    replayed = tmp_path / "replayed.parquet"
    cli = CliRunner()
    assert cli.invoke(main, ["replay", str(output), "-o", str(replayed)]).exit_code == 0
    same = cli.invoke(main, ["diff", str(output), str(replayed)])
    assert same.exit_code == 0 and "verdict: same" in same.output, same.output
