"""The package map of replay/ (replay/__init__.py) held as rules: which stage may import which.

Read from the source with ast, function-level imports included, so a lazy import cannot hide a
dependency. A module may import its own package and the packages its row allows; traces/ is the
base layer everyone may use; cli/ may use everything. The public API (replay/api.py) is a facade
over workloads, models and impls; the old flat paths are ordinary deprecated re-exports.

The engine families (replay/families/: vllm with v1/, mrv2/ and releases/, sglang) cut across the
stages: each module of a family has a role, named by its file (`ROLES`: a runner or worker is a
model, an observer an observer, variants an implementation, outcomes a workload's oracle, the rest
engine machinery), and is held to its role's row; a stage may import a family module whose role
is a stage it may import (or its own).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "replay"

#: package -> the other replay packages it may import.
ALLOWED = {
    "workloads": set(),
    "models": {"workloads"},
    "impls": {"models", "workloads"},
    "observers": {"models"},
    "engines": {"workloads", "models", "impls", "observers"},
    "check": set(),
    "workflows": {"workloads", "models", "impls", "observers", "engines", "check"},
    "views": set(),
}
#: A family module's stage, by its file name (replay/families/*/...): what it may import, and who
#: may import it. Names not listed are engine machinery (setup, loop, plugin, live, ...).
ROLES = {
    "runner": "models",
    "worker": "models",
    "batch": "models",
    "states": "models",
    "input_batch": "models",
    "releases": "models",
    "observer": "observers",
    "truth": "observers",
    "variants": "impls",
    "forms": "impls",
    "outcomes": "workloads",
    "recorded_inputs": "workloads",
    "shape": "workloads",
}
FAMILIES = ROOT / "families"


def role_of(name: str) -> str:
    """The stage of `specreplay.replay.families....` name `name` (a module, or a name in one; a
    release module: models; a family's package itself: families)."""
    parts = name.split(".")[3:]
    for end in range(len(parts), 0, -1):  # the module that defines the name: its longest prefix that is a file
        if FAMILIES.joinpath(*parts[:end]).with_suffix(".py").exists():
            module = parts[:end]
            return "models" if "releases" in module else ROLES.get(module[-1], "engines")
    return "families"


def family_modules() -> list[Path]:
    return sorted(p for p in FAMILIES.rglob("*.py") if p.name != "__init__.py")


def dotted(path: Path) -> str:
    return "specreplay." + ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)


#: Packages whose modules import no torch when they load (a function may, when it needs it:
#: asking whether CUDA is there), so `specreplay diff`, `show` and `--help` start fast.
NO_TORCH = ("check", "views", "observers", "workloads", "workflows", "impls")
#: The public API's own row: what it re-exports from. The packages after impls (and impls, whose
#: built-in variants are written against it) may import it; workloads and models may not (a cycle).
API_ALLOWED = {"models", "workloads", "impls"}
#: The old flat paths, each an ordinary module that re-exports its new home and warns.
DEPRECATED = {
    "checker": "specreplay.replay.check.checker",
    "engine": "specreplay.replay.engines.run",
    "messages": "specreplay.replay.models.messages",
    "runner": "specreplay.replay.families.vllm.v1.runner",
    "scheduler": "specreplay.replay.models.scheduler",
    "variants": "specreplay.replay.families.vllm.variants",
    "workload": "specreplay.replay.workloads.workload",
}


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
    """The stage `name` belongs to: its package, or for a family module its role."""
    parts = name.split(".")
    if parts[:2] != ["specreplay", "replay"] or len(parts) <= 2:
        return None
    if parts[2] == "families":
        return role_of(name)
    return parts[2]


def test_every_replay_module_sits_in_a_package_of_the_map():
    loose = sorted(p.stem for p in ROOT.glob("*.py") if p.name != "__init__.py")
    # At the top: the public API and the deprecated re-exports of the old flat paths, nothing else.
    assert loose == sorted(["api", *DEPRECATED])
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists())
    assert packages == sorted([*ALLOWED, "families"])
    # Every family module has a role the map knows.
    assert all(role_of(dotted(p)) in ALLOWED for p in family_modules())
    assert role_of("specreplay.replay.families.vllm.v1.runner.GPUModelRunner") == "models"
    assert role_of("specreplay.replay.families.sglang.setup") == "engines"


def sys_modules_assignments(path: Path) -> list[int]:
    """Lines that assign into sys.modules (an alias making two names one module)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Subscript) and ast.unparse(target.value) == "sys.modules"
    ]


def test_no_module_is_a_sys_modules_alias(tmp_path):
    aliases = [
        f"{p.relative_to(ROOT)}:{line}" for p in sorted(ROOT.rglob("*.py")) for line in sys_modules_assignments(p)
    ]
    assert not aliases, aliases
    alias = tmp_path / "alias.py"  # the check sees one
    alias.write_text("import sys\nfrom os import path as _module\nsys.modules[__name__] = _module\n")
    assert sys_modules_assignments(alias) == [3]


@pytest.mark.parametrize("old", sorted(DEPRECATED))
def test_an_old_path_is_a_deprecated_re_export(old):
    name, home = f"specreplay.replay.{old}", importlib.import_module(DEPRECATED[old])
    sys.modules.pop(name, None)  # import it afresh: the warning comes once per import
    with pytest.warns(DeprecationWarning, match=DEPRECATED[old]):
        module = importlib.import_module(name)
    assert module is not home
    public = getattr(home, "__all__", [n for n in vars(home) if not n.startswith("_")])  # what `import *` takes
    assert public and all(getattr(module, n) is getattr(home, n) for n in public)


def test_the_public_api_re_exports_from_its_row_only_and_loads_no_torch():
    names = imports_of(ROOT / "api.py")
    used = {replay_package(n) for n in names} - {None}
    assert used == API_ALLOWED, used
    for package in ("workloads", "models"):
        importers = [
            p.name for p in (ROOT / package).glob("*.py") if any(replay_package(n) == "api" for n in imports_of(p))
        ]
        assert not importers, f"replay/{package} imports the public API: {importers}"
    # Importing it loads neither torch nor the models (names resolve when first used).
    code = "import sys, specreplay.replay.api; print(sorted(m for m in sys.modules if m == 'torch' or '.models.' in m))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


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
    for path in family_modules():
        checked += 1
        role = role_of(dotted(path))
        for name in imports_of(path):
            other = replay_package(name)
            if other is not None and other != role and other in ALLOWED and other not in ALLOWED[role]:
                violations.append(f"{path.relative_to(ROOT)} ({role}) imports {name}")
    assert checked > 60
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
