"""Trace metadata is read through the typed header (traces.header) outside traces/: no code in
cli/, replay/, benchmarks/ or tests/ reads a header part by string key (`trace.outcome.get("status")`,
`trace.impl["engine"]`); it reads attributes (`trace.outcome.status`, `trace.impl.engine`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The header's parts, and the nested note of a run on recorded outcomes.
PARTS = {"outcome", "impl", "inputs", "workload", "config", "volatile", "outcomes"}
#: `<x>.inputs[...]` on these is an oracle's per-request turns, not trace metadata.
NOT_METADATA = {("oracle", "inputs"), ("self", "inputs")}


def _owner(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def string_keyed_reads(source: str) -> list[tuple[int, str]]:
    """(line, text) of every `<x>.<part>[...]`, `<x>.<part>.get(...)` and `"key" in <x>.<part>`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        target = None
        if isinstance(node, ast.Subscript):
            target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = node.func.value
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            target = node.comparators[0]
        if isinstance(target, ast.Attribute) and target.attr in PARTS:
            if (_owner(target.value), target.attr) not in NOT_METADATA:
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scan_sees_a_string_keyed_read():
    code = 'a = trace.outcome.get("status")\nb = golden.impl["engine"]\nc = "step" in t.outcome\n'
    assert [line for line, _ in string_keyed_reads(code)] == [1, 2, 3]
    assert string_keyed_reads("a = trace.outcome.status\nb = self.oracle.inputs[rid]\n") == []


def test_no_string_keyed_read_of_trace_metadata_outside_traces():
    offenders = []
    for folder in ("cli", "replay", "benchmarks", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():  # its own examples
                continue
            for line, text in string_keyed_reads(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not offenders, "read the typed header's attributes instead:\n" + "\n".join(offenders)
