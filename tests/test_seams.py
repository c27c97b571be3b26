"""The seams between generic code and the engine families hold (replay/families/__init__.py).

Outside the families (replay/families/), the registries (replay/engines/registry.py: engines and
runner families) and the traits a trace's readers ask (traces/families.py), no module compares a
runner family's or an engine's name, defaults a missing family by hand, keys a table by one, or
branches on a capability flag: it asks the registry or the traits. No module probes the oracle
with `getattr`: the oracle's contract is its class (workloads/oracle.py). Read from the source
with ast, so the check cannot be talked around by formatting; a test shows each rule can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where families and engines may be told apart by name: the families, the registries, the traits,
#: and the two catalogues that are data about them (the checker's codes and the known failures,
#: each entry naming the runner families it is about).
EXEMPT = (
    "replay/families/",
    "replay/engines/registry.py",
    "replay/check/catalogue.py",
    "replay/workloads/known_bugs.py",
)
#: The names of the runner families and the engines (and engine lines).
NAMES = {"v1", "v2", "sglang", "vllm", "reference", "vllm-scheduler", "sglang-scheduler", "vllm (attached)"}
#: The names that key a table by family or engine ("vllm" also keys JSON summaries: the release).
TABLE_KEYS = NAMES - {"vllm"}
#: The registry's capability flags: generic code asks the registry a question instead.
FLAGS = {
    "serves_vllm",
    "vllm_outcomes",
    "drives_itself",
    "takes_oracle",
    "needs_vllm",
    "verifies_slot_drafts",
    "observed_like_live",
    "scheduler_v2_mode",
}


def scanned() -> list[Path]:
    files = sorted([*(ROOT / "replay").rglob("*.py"), *(ROOT / "cli").rglob("*.py")])
    return [p for p in files if not str(p.relative_to(ROOT)).startswith(EXEMPT)]


def _named(node: ast.AST, names: set[str] = NAMES) -> bool:
    """A family's or an engine's name as a literal, or a literal collection of them."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_named(e, names) for e in node.elts)
    return False


def _flag_in(node: ast.AST) -> str | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in FLAGS:
            return sub.attr
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "getattr":
            if len(sub.args) > 1 and isinstance(sub.args[1], ast.Constant) and sub.args[1].value in FLAGS:
                return str(sub.args[1].value)
    return None


def problems_in(source: str, name: str = "<source>") -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare) and any(_named(x) for x in [node.left, *node.comparators]):
            found.append(f"{where}: compares a family's or an engine's name ({ast.unparse(node)})")
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and any(_named(v) for v in node.values):
            found.append(f"{where}: defaults a family or an engine by name ({ast.unparse(node)})")
        elif isinstance(node, ast.Dict) and any(k is not None and _named(k, TABLE_KEYS) for k in node.keys):
            found.append(f"{where}: a table keyed by a family's or an engine's name")
        elif isinstance(node, ast.If | ast.IfExp | ast.While | ast.Assert) and (flag := _flag_in(node.test)):
            found.append(f"{where}: branches on the capability flag {flag}")
        elif isinstance(node, ast.comprehension) and any(flag := _flag_in(cond) for cond in node.ifs):
            found.append(f"{where}: filters on the capability flag {flag}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and node.args
            and ast.unparse(node.args[0]).split(".")[-1] == "oracle"
        ):
            found.append(f"{where}: probes the oracle ({ast.unparse(node)}); the Oracle class states its contract")
    return found


def test_generic_code_asks_the_families_instead_of_naming_them():
    found = [p for path in scanned() for p in problems_in(path.read_text(), str(path.relative_to(ROOT)))]
    assert len(scanned()) > 100
    assert not found, "\n".join(found)


def test_each_rule_can_fail():
    assert problems_in('if family == "v2":\n    pass')
    assert problems_in('x = runner in ("v1", "v2")')
    assert problems_in('family = impl.runner_family or "v1"')
    assert problems_in('extra = {"sglang": 1}.get(family)')
    assert problems_in("if entry.serves_vllm:\n    pass")
    assert problems_in("xs = [e for e in engines if e.drives_itself]")
    assert problems_in('flag = getattr(oracle, "recorded", False)')
    assert problems_in('flag = getattr(self.oracle, "drafter", "fixed")')
    assert not problems_in("if traits(name).line is EngineLine.VLLM:\n    pass")
