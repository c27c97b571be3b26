"""The flight recorder's online checks (traces/online_checks.py): silent on a real recording, each
fires on the line that breaks its invariant, once per window, and writes the window with a
`check` line that merge names.

The lines are the real V1 dump of tests/traces/data/crash-window/ (test_window.py says what ran),
one column of one line changed where a check must fire.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from specreplay.traces.errors import InputError
from specreplay.traces.online_checks import CHECKS, online_checks
from specreplay.traces.parts import PartWriter

DUMP = Path(__file__).parent / "data" / "crash-window"


def real_lines() -> list[dict]:
    return [json.loads(line) for path in sorted(DUMP.glob("*.jsonl")) for line in path.read_text().splitlines()]


def first(kind: str, column: str) -> dict:
    return next(e for e in real_lines() if e["e"] == kind and column in (e.get("cols") or e.get("names") or ()))


def test_no_check_fires_on_a_real_recording():
    for event in real_lines():
        assert {name: check(event) for name, check in CHECKS.items()} == dict.fromkeys(CHECKS)


def test_each_check_fires_on_the_line_that_breaks_it():
    rows = copy.deepcopy(first("rows", "sched_num_output_placeholders"))
    rows["rows"][0][rows["names"].index("sched_num_output_placeholders")] = -1
    rid = rows["rows"][0][rows["names"].index("request_id")]
    assert (
        CHECKS["negative-placeholders"](rows)
        == f"request {rid!r} at step {rows['rows'][0][0]}: num_output_placeholders -1"
    )

    worker = copy.deepcopy(first("cols", "worker_negative_inputs"))
    worker["cols"]["worker_negative_inputs"][1] = 2
    assert "2 input id(s) below zero" in CHECKS["negative-inputs"](worker)

    applied = copy.deepcopy(first("cols", "apply_num_tokens"))
    applied["cols"]["apply_num_tokens"][0] -= 1  # one token of the output never appended
    assert "tokens applied" in CHECKS["lost-tokens"](applied)
    applied["cols"]["apply_finish_reason"][0] = "length"  # cut by a finish: no loss
    assert CHECKS["lost-tokens"](applied) is None


def test_a_failed_check_writes_the_window_once_per_window(tmp_path):
    fired = []
    writer = PartWriter(
        str(tmp_path),
        "runner",
        {"e": "part", "run": "r", "role": "runner"},
        window=5,
        checks=("negative-inputs",),
        on_check=lambda name, message: fired.append((name, message)),
    )
    line = first("cols", "worker_negative_inputs")
    for step in range(1, 21):
        event = copy.deepcopy(line)
        event["step"] = step
        if step in (3, 4, 12):  # 4 is inside the window of 3's dump: not again; 12 is past it
            event["cols"]["worker_negative_inputs"][0] = 1
        writer.write(event)
        writer.flush()
    assert [m.split(": ")[0] for _, m in fired] == [
        f"request {line['ids'][0]!r} at step 3",
        f"request {line['ids'][0]!r} at step 12",
    ]
    writer.close()


def test_a_check_dump_merges_and_says_which_check_wrote_it(tmp_path):
    from specreplay.replay.workflows.merge import merge_folder

    shutil.copytree(DUMP, tmp_path / "dump")
    runner = next((tmp_path / "dump").glob("runner-*.jsonl"))
    lines = runner.read_text().splitlines()
    check = {"e": "check", "name": "negative-inputs", "message": "request 'w2-0' at step 20: 1 input id(s) below zero"}
    runner.write_text("\n".join([*lines[:2], json.dumps(check), *lines[2:]]) + "\n")
    merged = merge_folder(tmp_path / "dump")
    assert merged.trace.impl.window.startswith(
        "steps 17..26 of the recorded engine (dumped on check negative-inputs: request 'w2-0' at step 20"
    )


def test_the_checks_are_named_and_off_by_default(monkeypatch):
    monkeypatch.delenv("SPECREPLAY_DUMP_ON", raising=False)
    assert online_checks() == ()
    monkeypatch.setenv("SPECREPLAY_DUMP_ON", "lost-tokens, negative-inputs,lost-tokens")
    assert online_checks() == ("lost-tokens", "negative-inputs")
    monkeypatch.setenv("SPECREPLAY_DUMP_ON", "lost-tokens,kv-corrupt")
    with pytest.raises(InputError, match="no online check 'kv-corrupt'; the checks are negative-placeholders"):
        online_checks()
