"""A trace whose workload defines no request leaves S9 (it needs each life's max_tokens)
unchecked, and the reports say so for what it is, not as missing ground truth."""

from __future__ import annotations

import dataclasses
import json

from click.testing import CliRunner

from specreplay.cli.gate_reports import junit_xml
from specreplay.cli.main import main
from specreplay.cli.render import unchecked_note
from specreplay.replay.workflows.gate import GateResult
from specreplay.traces.io import write_trace

S9 = "S9-step-past-max-tokens"


def test_diff_says_s9_was_not_checked_for_want_of_limits(reentry_traces, tmp_path):
    bare = dataclasses.replace(reentry_traces["upstream"], workload={"name": "no requests"})
    path = tmp_path / "bare.parquet"
    write_trace(bare, path)
    doc = json.loads(CliRunner().invoke(main, ["diff", str(path), "--format", "json"]).output)
    assert doc["unchecked"] == [S9]
    out = CliRunner().invoke(main, ["diff", str(path), "--no-story"]).output
    assert f"no max_tokens in the workload: {S9} not checked" in out and "no ground truth" not in out


def test_the_notes_keep_the_two_reasons_apart():
    both = ["T1-wrong-token", S9]
    assert unchecked_note(both) == (
        f"no ground truth: T1-wrong-token not checked; no max_tokens in the workload: {S9} not checked"
    )
    xml = junit_xml([GateResult("bare.parquet", "pass", unchecked=both)])
    assert "T1-wrong-token not checked: the trace holds no ground truth" in xml
    assert f"{S9} not checked: the workload gives no max_tokens" in xml
