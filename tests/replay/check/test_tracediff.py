"""The vectorised, streaming trace diff reports what a row-by-row comparison reports: the same
first difference per field, the same counts, whatever the batch size, on traces that part."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces import schema

_KEY = ("step", "request_id")
COLUMNS = [c for c in schema.COLUMN_NAMES if c not in _KEY]


def rowwise(a, b) -> tuple[dict, dict, int, int, int]:
    """The plain statement: match rows on (step, request), compare every column, first per field."""

    def rows(t):
        return {(s, r): i for i, (s, r) in enumerate(zip(t["step"].to_pylist(), t["request_id"].to_pylist()))}

    ra, rb = rows(a.table), rows(b.table)
    ca = {c: a.table[c].to_pylist() for c in COLUMNS}
    cb = {c: b.table[c].to_pylist() for c in COLUMNS}
    first, counts, only_a, only_b, compared = {}, {}, 0, 0, 0
    for key in sorted(set(ra) | set(rb)):
        ia, ib = ra.get(key), rb.get(key)
        if ia is None or ib is None:
            only_a += ia is not None
            only_b += ib is not None
            counts["(row)"] = counts.get("(row)", 0) + 1
            first.setdefault("(row)", (key, ia is not None, ib is not None))
            continue
        compared += 1
        for c in COLUMNS:
            if ca[c][ia] != cb[c][ib]:
                counts[c] = counts.get(c, 0) + 1
                first.setdefault(c, (key, ca[c][ia], cb[c][ib]))
    return first, counts, only_a, only_b, compared


@pytest.fixture(scope="module")
def pairs():
    out = []
    for scenario, seed in (("reentry", 0), ("random", 3), ("random", 38), ("random", 50)):
        workload = build_scenario(scenario, seed)
        traces = [
            run_workload(workload, resolve(name, allow_import=False))
            for name in ("upstream", "pr30796", "pr30796-copy", "sched-clear")
        ]
        out += [(traces[0], t) for t in traces[1:]] + [(traces[1], traces[2])]
    rng = random.Random(4)
    base = out[0][0]
    for _ in range(6):  # rows dropped or shuffled within a step: keys that exist on one side only
        keep = sorted(rng.sample(range(base.table.num_rows), base.table.num_rows - rng.randint(1, 5)))
        out.append((base, type(base)(**{**base.__dict__, "table": base.table.take(pa.array(keep))})))
    return out


def test_same_result_as_row_by_row(pairs):
    parted = 0
    for a, b in pairs:
        first, counts, only_a, only_b, compared = rowwise(a, b)
        parted += bool(counts)
        for batch_rows in (1 << 20, 7, 1):
            diff = diff_traces(a, b, batch_rows=batch_rows)
            assert dict(diff.fields) == counts
            assert (diff.only_a, diff.only_b, diff.rows_compared) == (only_a, only_b, compared)
            got = {
                f.field: ((f.step, f.request_id), f.scheduler, f.worker)
                for f in diff.findings
                if f.field != "(outcome)"
            }
            assert got == first
            # The evidence: A's value expected, B's actual; the life of the row named.
            assert [(f.expected, f.actual) for f in diff.findings] == [(f.scheduler, f.worker) for f in diff.findings]
            assert [f.life is None for f in diff.findings] == [f.request_id is None for f in diff.findings]
    assert parted >= 10  # most pairs differ, several with rows on one side only


@pytest.mark.parametrize(
    ("a", "b", "agree"),
    [
        (("partial", 7), ("step_limit", 7), True),  # a recording that lost its tail, rerun to its last step
        (("completed", 7), ("partial", 7), True),
        (("partial", 7), ("step_limit", 8), False),  # not the same last step
        (("partial", 7), ("crashed", 7), False),  # a crash is news, whatever the recording knew
        (("step_limit", 7), ("completed", 7), False),  # both whole: work left or not is a difference
    ],
)
def test_a_partial_recording_agrees_with_a_rerun_that_stopped_where_it_did(a, b, agree):
    from specreplay.traces.header import Outcome

    base = run_workload(build_scenario("reentry", 0), resolve("upstream", allow_import=False))
    ta, tb = (type(base)(**{**base.__dict__, "outcome": Outcome(status=s, step=n)}) for s, n in (a, b))
    assert ("(outcome)" not in diff_traces(ta, tb).fields) is agree
