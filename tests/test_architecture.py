"""The package map of replay/ (replay/__init__.py) held as rules: which stage may import which.

Read from the source with ast, function-level imports included, so a lazy import cannot hide a
dependency. A module may import its own package and the packages its row allows; traces/ is the
base layer everyone may use; cli/ may use everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "replay"

#: package -> the other replay packages it may import.
ALLOWED = {
    "workloads": set(),
    "models": {"workloads"},
    "impls": {"models", "workloads"},
    "record": {"models"},
    "engines": {"workloads", "models", "impls", "record"},
    "check": set(),
    "workflows": {"workloads", "models", "impls", "record", "engines", "check"},
    "views": set(),
}
#: Packages whose modules import no torch when they load (a function may, when it needs it:
#: asking whether CUDA is there), so `specreplay diff`, `show` and `--help` start fast.
NO_TORCH = ("check", "views", "record", "workloads", "workflows", "impls")


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def top_level_imports(path: Path) -> set[str]:
    """What importing the module loads (the body, not functions; TYPE_CHECKING blocks skipped)."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def replay_package(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if parts[:2] == ["specreplay", "replay"] and len(parts) > 2 else None


def test_every_replay_module_sits_in_a_package_of_the_map():
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    # Only the compatibility aliases live at the top, and each is one line of aliasing.
    assert loose == ["checker.py", "engine.py", "runner.py", "scheduler.py", "workload.py"]
    for name in loose:
        assert "sys.modules[__name__] = _module" in (ROOT / name).read_text()
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(ALLOWED)


def test_each_package_imports_only_the_stages_before_it():
    violations = []
    checked = 0
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).glob("*.py")):
            checked += 1
            for name in imports_of(path):
                other = replay_package(name)
                if other is not None and other != package and other in ALLOWED and other not in allowed:
                    violations.append(f"replay/{package}/{path.name} imports {name}")
    assert checked > 30
    assert not violations, "\n".join(violations)


def test_torch_stays_out_of_the_light_packages():
    heavy = [
        f"replay/{package}/{path.name}"
        for package in NO_TORCH
        for path in sorted((ROOT / package).glob("*.py"))
        if any(name == "torch" or name.startswith("torch.") for name in top_level_imports(path))
    ]
    assert not heavy, heavy


def test_the_rules_can_fail(tmp_path):
    """The checker of the rules sees a forbidden import, lazy or not."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from specreplay.replay.engines.loop import EngineLoop\n")
    assert replay_package(next(n for n in imports_of(bad) if n.endswith("loop"))) == "engines"
