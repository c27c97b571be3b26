"""No module chooses an engine by its name: only engines/registry.py compares engine names
(issue 26). Everything else asks the engine's entry what it supports.

Read from the source with ast over cli/, replay/ and benchmarks/: a comparison (==, !=, in, not
in, a match case) against a registered engine's name, alone or in a literal tuple, list or set,
or an expression naming an engine compared with a string, is a finding.
"""

from __future__ import annotations

import ast
from pathlib import Path

from specreplay.replay.engines.registry import ENGINES

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("cli", "replay", "benchmarks")
REGISTRY = "replay/engines/registry.py"
NAMES = frozenset(ENGINES)


def _names_in(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    return set()


def _names_an_engine(node: ast.AST) -> bool:
    return "engine" in ast.unparse(node).lower() and not isinstance(node, ast.Constant)


def engine_name_comparisons(path: Path, shown: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            by_name = any(_names_in(side) for side in sides)
            strings = any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)
            by_engine = strings and any(_names_an_engine(s) for s in sides)
            if by_name or by_engine:
                found.append(f"{shown}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            if _names_in(node.pattern.value):
                found.append(f"{shown}:{node.pattern.lineno}: case {ast.unparse(node.pattern)}")
    return found


def test_no_engine_is_chosen_by_name_outside_the_registry():
    found, scanned = [], 0
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            shown = path.relative_to(ROOT).as_posix()
            if shown == REGISTRY:
                continue
            scanned += 1
            found += engine_name_comparisons(path, shown)
    assert scanned > 80
    assert not found, "\n".join(found)


def test_the_scan_sees_each_form(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(engine, impl, kind):\n"
        "    if engine == 'vllm': pass\n"
        "    if impl.get('engine') != 'reference': pass\n"
        "    if engine in ('reference', 'vllm-scheduler'): pass\n"
        "    if trace.impl['engine'] == 'sglang': pass\n"  # a name not registered yet, still by name
        "    match kind:\n"
        "        case 'vllm-scheduler': pass\n"
        "    if kind == 'E1-engine-crash': pass\n"  # the checker's codes are no engine names
    )
    assert [line.split(":")[1] for line in engine_name_comparisons(bad, "bad.py")] == ["2", "3", "4", "5", "7"]
