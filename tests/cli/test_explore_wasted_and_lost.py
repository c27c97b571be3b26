"""explore finds a wasted step (S9) and a lost token (S8) from random workloads with no hint, on
variants loaded as a user's plugin would be (tests/replay/check/broken_outputs.py), at the
request and step the saved trace reproduces; upstream, on the same search, finds neither."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.traces.io import read_trace

BUDGET = 400  # workloads, as the README's explore; about 15 s each on a 2-core machine
VARIANTS = "tests.replay.check.broken_outputs"


def _explore(impl: str, folder) -> dict:
    result = CliRunner().invoke(main, ["explore", "--impl", impl, "--budget", str(BUDGET), "-o", str(folder)])
    assert result.exit_code in (0, 1), result.output
    return json.loads((folder / "explore.json").read_text())["findings"]


@pytest.mark.parametrize(
    "variant, code",
    [("NoMaxTokensSkip", "S9-step-past-max-tokens"), ("TrimsAcceptedDrafts", "S8-token-lost")],
)
def test_explore_finds_it_and_saves_a_trace_that_reproduces_it(variant, code, tmp_path):
    found = _explore(f"{VARIANTS}:{variant}", tmp_path)
    assert code in found and found[code]["workloads"] >= BUDGET // 4  # not a rare shape
    trace = read_trace(tmp_path / found[code]["trace"])
    hits = [(f.step, f.request_id) for f in check_trace(trace) if f.code == code]
    assert hits[0] == (found[code]["step"], found[code]["request_id"])


def test_upstream_gives_neither_on_the_same_search(tmp_path):
    found = _explore("upstream", tmp_path)
    assert not {"S8-token-lost", "S9-step-past-max-tokens"} & set(found)
