"""The checker's column list (check/frames.py NEEDED) is what its code reads, no more, no less.

NEEDED is derived from the loader's own tables; here: the loader works on a trace cut down to
NEEDED, fails without any one of them, and every column the rule families name is in it; and
it reads a column's nulls exactly as pyarrow does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specreplay.replay.check import frames
from specreplay.replay.check.checker import check_trace
from specreplay.replay.check.framework import SAMPLED_COLUMNS
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces import schema

CHECK = Path(frames.__file__).parent
#: The checker's modules: the frames, the framework, the rule families and the catalogue. Not the
#: trace diff (it reads every column) nor situations.py (explore's coverage of situations).
CHECKER = sorted(p for p in CHECK.glob("*.py") if p.name not in ("tracediff.py", "situations.py", "__init__.py"))


def columns_named(path: Path) -> set[str]:
    """Schema columns a module names as string constants (`x_is_null` masks count as `x`)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.removesuffix("_is_null")
            if name in schema.COLUMN_NAMES:
                names.add(name)
    return names


@pytest.fixture(scope="module")
def trace():
    return run_workload(build_scenario("reentry"), resolve("upstream", allow_import=False))


def test_needed_is_in_schema_order_and_every_rule_column_is_in_it():
    assert frames.NEEDED == schema.in_schema_order(frames.NEEDED)
    assert len(CHECKER) > 10
    named = set().union(*(columns_named(p) for p in CHECKER))
    # Beyond NEEDED: what G9 reads where the outcome holds the ids each client received
    # (checker.columns_needed adds them for such a trace only).
    assert named - set(frames.NEEDED) == set(SAMPLED_COLUMNS) - set(frames.NEEDED) == {"worker_sampled_ids"}


def test_the_loader_needs_every_column_of_needed_and_nothing_else(trace):
    table = trace.table.select(list(frames.NEEDED))
    cols = frames.load_columns(table, lambda key: hash(key) & 0xFFFF)
    # Each column arrives under its own name, or as what the loader derives from it.
    derived = {"request_id": "request", "truth_kv_ok": "truth_kv_not_ok", "worker_draft_ids": "worker_num_draft_ids"}
    assert {derived.get(n, n) for n in frames.NEEDED} <= set(cols)
    for name in frames.NEEDED:
        with pytest.raises(KeyError):
            frames.load_columns(table.drop_columns([name]), lambda key: 0)


def test_the_checker_gives_the_same_findings_on_needed_alone(trace):
    import dataclasses

    bare = dataclasses.replace(trace, table=trace.table.select(list(frames.NEEDED)))
    assert check_trace(bare) == check_trace(trace)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.integers(-(1 << 15), (1 << 15) - 1)), max_size=40),
    width=st.sampled_from([pa.int16(), pa.int32(), pa.int64()]),
    cut=st.tuples(st.integers(0, 40), st.integers(0, 40)),
    chunks=st.integers(1, 3),
    fill=st.sampled_from([-1, 0, 7]),
)
def test_the_loader_reads_nulls_as_pyarrow_fills_them(values, width, cut, chunks, fill):
    # frames.filled reads the Arrow buffers itself (offsets, validity bits, chunks): it must give
    # exactly what fill_null and is_null give, on any slice of any column.
    column = pa.array(values, type=width).slice(min(cut[0], len(values)), cut[1])
    if chunks > 1:
        step = max(1, len(column) // chunks)
        column = pa.chunked_array([column.slice(i, step) for i in range(0, len(column), step)] or [column], type=width)
    got, is_null = frames.filled(column, fill)
    expected = pc.fill_null(column, fill)
    expected = (expected.combine_chunks() if isinstance(expected, pa.ChunkedArray) else expected).to_numpy()
    assert got.dtype == expected.dtype and got.tolist() == expected.tolist()
    assert is_null.tolist() == column.is_null().to_pylist()
