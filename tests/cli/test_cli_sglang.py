"""`specreplay diff A B` and `specreplay export` on SGLang traces (cli/diff.py, cli/show.py, replay/views/perfetto.py).

Neither needs SGLang: they read the SGLang goldens shipped in replay/corpus/sglang-scheduler/ (made
on SGLang 0.5.23's real scheduler), so they run in the main environment as in SGLang's.
`reentry` and `reentry-sync` are the same workload with the overlap schedule on and off.
"""

from __future__ import annotations

import json
from collections import Counter

from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.workflows.gate import corpus_dir
from specreplay.traces.io import read_trace

GOLDENS = corpus_dir("sglang-scheduler")


def golden(name: str) -> str:
    return str(GOLDENS / f"{name}.parquet")


# ====================================================================== two traces
def test_overlap_on_and_off_part_where_the_result_lands_an_iteration_later():
    """Under overlap the first batch's result is processed in the next iteration (apply_step 2);
    without it, in the same one: the first difference, then the fields that follow from it."""
    result = CliRunner().invoke(main, ["diff", golden("reentry"), golden("reentry-sync"), "--format", "json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    first = doc["findings"][0]
    assert (first["code"], first["step"], first["request_id"], first["field"]) == (
        "D1-trace-differs",
        1,
        "0",
        "apply_step",
    )
    assert (first["scheduler"], first["worker"]) == (2, 1)  # A's value, B's value
    differing = {f["field"] for f in doc["findings"]}
    assert {"sched_kv_committed_len", "sched_num_in_flight_tokens"} <= differing


def test_an_sglang_trace_against_itself_is_the_same():
    result = CliRunner().invoke(main, ["diff", golden("retract"), golden("retract")])
    rows = read_trace(golden("retract")).num_rows
    assert result.exit_code == 0 and f"{rows} rows compared, no difference" in result.output, result.output


# ====================================================================== the Perfetto export
def export(tmp_path, name: str) -> dict:
    out = tmp_path / f"{name}.json"
    result = CliRunner().invoke(main, ["export", golden(name), "--perfetto", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_the_export_has_both_views_of_every_request_with_sglangs_own_lengths(tmp_path):
    doc = export(tmp_path, "retract")
    events = doc["traceEvents"]
    rows = read_trace(golden("retract")).table.to_pylist()
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = Counter((e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name")
    assert sorted(names.values()) == sorted(f"request {rid}" for rid in {r["request_id"] for r in rows})
    assert all(threads[(pid, "scheduler")] == threads[(pid, "worker")] == 1 for pid in names)
    by_tid = Counter(e["cat"] for e in events if e["ph"] == "X")
    assert by_tid == {"scheduler": len(rows), "worker": sum(r["worker_row"] is not None for r in rows)}
    counters = Counter(e["name"] for e in events if e["ph"] == "C")
    ran = sum(r["worker_row"] is not None for r in rows)
    assert counters == {
        "kv_committed_len (scheduler)": len(rows),
        "kv_allocated_len (scheduler)": len(rows),
        "seq_len (worker)": ran,
        "new_seq_len (worker)": ran,  # EAGLE v2: what the worker published to the FutureMap
    }
    # The values are the rows' own: the request's committed and allocated lengths, step by step.
    pid_of = {name.removeprefix("request "): pid for pid, name in names.items()}
    for row in rows[:40]:
        ts = (row["step"] - 1) * 1000
        at = {
            e["name"]: e["args"]["value"]
            for e in events
            if e["ph"] == "C" and e["pid"] == pid_of[row["request_id"]] and e["ts"] == ts
        }
        assert at["kv_committed_len (scheduler)"] == row["sched_kv_committed_len"]
        assert at["kv_allocated_len (scheduler)"] == row["sched_kv_allocated_len"]
    worker = next(
        e for e in events if e["ph"] == "X" and e["cat"] == "worker" and e["args"]["forward_mode"] == "target_verify"
    )
    assert worker["name"] == "target_verify 1+3"  # the bonus token and 3 drafts
    assert {"seq_len", "new_seq_len", "emitted", "accepted"} <= worker["args"].keys()


def test_a_result_applied_in_the_next_iteration_is_an_arrow_only_under_overlap(tmp_path):
    overlap = [e for e in export(tmp_path, "reentry")["traceEvents"] if e.get("cat") == "apply"]
    rows = read_trace(golden("reentry")).table.to_pylist()
    launched = [r for r in rows if r["sched_num_scheduled_tokens"] and r["apply_outcome"] == "applied"]
    assert all(r["apply_step"] == r["step"] + 1 for r in launched)
    starts = [e for e in overlap if e["ph"] == "s"]
    assert starts and len(starts) == len([e for e in overlap if e["ph"] == "f"]) <= len(launched)
    sync = [e for e in export(tmp_path, "retract-sync")["traceEvents"] if e.get("cat") == "apply"]
    assert sync == []  # without overlap a batch's result is processed in the iteration that launched it
