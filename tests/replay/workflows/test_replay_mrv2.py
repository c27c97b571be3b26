"""A Model Runner V2 recording is not replayed through the V1 reference runner (the only reference
runner there is): one line says so and what runs it again, on every command that replays a
recording's outcomes. Reads a real MRV2 recording of the seed scenario; no vLLM needed."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.workflows.replaying import plan_replay
from specreplay.traces.io import read_trace

MRV2 = Path(__file__).parents[1] / "views" / "data" / "reentry-mrv2.parquet"


def test_replay_of_an_mrv2_recording_is_one_line_naming_the_way_to_rerun_it(tmp_path):
    assert read_trace(MRV2).impl.runner_family == "v2"
    for argv in (["replay", str(MRV2), "-o", str(tmp_path / "r.parquet")], ["gate", str(MRV2)]):
        result = CliRunner().invoke(main, argv, env={"COLUMNS": "500"})  # the gate's table unwrapped
        assert result.exit_code in (1, 2), result.output  # the gate reports it as that golden's error
        assert "Model Runner V2" in result.output and "--oracle synthetic --engine vllm" in result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "r.parquet").exists()


def test_a_synthetic_rerun_of_an_mrv2_recording_builds_its_runner():
    plan = plan_replay(read_trace(MRV2), str(MRV2), engine="vllm", oracle="synthetic")
    assert plan.runner == "v2" and plan.oracle is None
