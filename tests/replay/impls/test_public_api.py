"""docs/implementations.md held to the public API (specreplay.replay.api).

Every `specreplay.replay.api.X` the page mentions imports from the API; every hook its tables
name exists on the class the table says, with the parameters written there (inspect.signature),
so a hook renamed or re-signed in the code fails here; the state the page lists is on a built
scheduler and runner; the page's examples run and do what the built-ins do.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from pathlib import Path

import pytest

from specreplay.replay import api

DOC = Path(__file__).resolve().parents[3] / "docs" / "implementations.md"
HOOK_HEADER = "| hook | class | decides |"
#: `name(params)` at the start of a backticked span, `-> ...` after it ignored.
CALL = re.compile(r"`(\w+)\(([^)`]*)\)[^`]*`")


def doc_text() -> str:
    return DOC.read_text()


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of every row of every table whose header line is `header`."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.strip() == header:
            inside = True
            continue
        if inside and not line.startswith("|"):
            inside = False
        if inside and not line.startswith("| ---"):
            # `\|` inside a cell is a literal bar (a return type `x | None`), not a cell border.
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def api_class(cell: str) -> type:
    match = re.fullmatch(r"`specreplay\.replay\.api\.(\w+)`", cell)
    assert match, f"the class cell {cell!r} is not a public-API path"
    return getattr(api, match.group(1))


def hooks_in(text: str) -> list[tuple[type, str, list[str]]]:
    """(class, hook, documented parameters) for every hook the hook tables name."""
    found = []
    for hook_cell, class_cell, _ in table_rows(text, HOOK_HEADER):
        calls = CALL.findall(hook_cell)
        assert calls, f"no hook in {hook_cell!r}"
        for name, params in calls:
            found.append((api_class(class_cell), name, [p.strip() for p in params.split(",") if p.strip()]))
    return found


def signature_problem(cls: type, name: str, params: list[str]) -> str | None:
    """Why `cls.name` does not match the documented parameters (None: it does)."""
    method = inspect.getattr_static(cls, name, None)
    if method is None or not callable(getattr(cls, name)):
        return f"{cls.__name__} has no hook {name}"
    names = [p for p in inspect.signature(getattr(cls, name)).parameters if p not in ("self", "cls")]
    if names != params:
        return f"{cls.__name__}.{name}{tuple(names)} is documented as {name}({', '.join(params)})"
    return None


def test_every_api_name_the_page_mentions_imports_from_the_api():
    names = set(re.findall(r"specreplay\.replay\.api\.(\w+)", doc_text()))
    assert len(names) > 20
    missing = [n for n in sorted(names) if n not in api.__all__]
    assert not missing, missing
    namespace: dict = {}
    exec(f"from specreplay.replay.api import {', '.join(sorted(names))}", namespace)
    assert all(namespace[n] is getattr(api, n) for n in names)


def test_the_api_resolves_every_name_it_exports():
    lists = {
        "SCHEDULER_HOOKS",
        "RUNNER_HOOKS",
        "IMPLEMENTATION_HOOKS",
        "SGLANG_WORKER_HOOKS",
        "SCHEDULER_STATE",
        "RUNNER_STATE",
    }
    assert set(api.__all__) == set(api._HOME) | lists
    for name, home in api._HOME.items():
        assert getattr(api, name) is getattr(importlib.import_module(home), name)


def test_every_hook_in_the_tables_exists_with_its_documented_signature():
    hooks = hooks_in(doc_text())
    problems = [p for cls, name, params in hooks if (p := signature_problem(cls, name, params))]
    assert not problems, "\n".join(problems)
    documented = {name for _, name, _ in hooks}
    assert documented == set(
        api.SCHEDULER_HOOKS + api.RUNNER_HOOKS + api.IMPLEMENTATION_HOOKS + api.SGLANG_WORKER_HOOKS
    )
    by_class = {name: cls for cls, name, _ in hooks}
    assert all(issubclass(by_class[n], api.Scheduler) for n in api.SCHEDULER_HOOKS)
    assert all(by_class[n] is api.GPUModelRunner for n in api.RUNNER_HOOKS)
    assert all(by_class[n] is api.Implementation for n in api.IMPLEMENTATION_HOOKS)
    assert all(by_class[n] is api.SglangReferenceWorker for n in api.SGLANG_WORKER_HOOKS)


def test_a_renamed_or_re_signed_hook_fails_the_check():
    """The check sees a hook that is gone, and one whose parameters changed."""
    row = "| hook | class | decides |\n| --- | --- | --- |\n| `{}` | `specreplay.replay.api.GPUModelRunner` | x |\n"
    (gone,) = hooks_in(row.format("on_reentry_renamed(out, rid) -> bool"))
    assert signature_problem(*gone) == "GPUModelRunner has no hook on_reentry_renamed"
    (changed,) = hooks_in(row.format("on_reentry(out, req_id) -> bool"))
    assert "documented as on_reentry(out, req_id)" in signature_problem(*changed)
    (right,) = hooks_in(row.format("on_reentry(out, rid) -> bool"))
    assert signature_problem(*right) is None


@pytest.mark.parametrize("cls", ["Scheduler", "GPUModelRunner"])
def test_the_hook_lists_in_the_models_docstrings_are_the_apis(cls):
    """models/scheduler.py and families/vllm/v1/runner.py list their hooks in their docstrings too: each one
    listed is a hook of the API, with the parameters the code has (where it writes them out, not "...")."""
    doc = inspect.getmodule(getattr(api, cls)).__doc__
    block = doc[doc.index("Hooks") :].split("\n\n")[0]
    listed = re.findall(r"(?:^ +|/ )(\w+)\(([^)]*)\)", block, flags=re.MULTILINE)
    assert len(listed) > 10
    hooks = set(api.SCHEDULER_HOOKS + api.RUNNER_HOOKS)
    assert [name for name, _ in listed if name not in hooks] == []
    target = {"Scheduler": api.AsyncScheduler, "GPUModelRunner": api.GPUModelRunner}[cls]
    problems = [
        p
        for name, params in listed
        if "..." not in params
        and (p := signature_problem(target, name, [x.strip() for x in params.split(",") if x.strip()]))
    ]
    assert not problems, "\n".join(problems)


def built_runner(config):
    from specreplay.replay.workloads.workload import RequestSpec, Workload

    return api.GPUModelRunner(config, api.Oracle(Workload([RequestSpec("a", 3, 4)], config, name="api")))


def test_the_documented_state_is_on_a_built_scheduler_and_runner():
    text = doc_text()
    config = api.EngineConfig()
    for cls in (api.Scheduler, api.AsyncScheduler):
        scheduler = cls(config)
        assert [n for n in api.SCHEDULER_STATE if not hasattr(scheduler, n)] == []
    runner = built_runner(config)
    assert [n for n in api.RUNNER_STATE if not hasattr(runner, n)] == []
    assert [n for n in api.SCHEDULER_STATE + api.RUNNER_STATE if f"`self.{n}`" not in text] == []


def test_the_runners_old_batch_name_still_reads_the_input_batch():
    runner = built_runner(api.EngineConfig())
    with pytest.warns(DeprecationWarning, match="input_batch"):
        assert runner.batch is runner.input_batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert runner.input_batch is not None  # the documented name does not warn


def examples() -> dict[str, type]:
    """The classes the page's Python examples define, each block run on its own."""
    classes: dict[str, type] = {}
    for block in re.findall(r"```python\n(.*?)```", doc_text(), flags=re.DOTALL):
        namespace: dict = {}
        exec(compile(block, str(DOC), "exec"), namespace)
        classes |= {k: v for k, v in namespace.items() if isinstance(v, type) and k not in api.__all__}
    return classes


def test_the_pages_examples_run_and_do_what_the_built_ins_do():
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.scenarios import build_scenario

    classes = examples()
    assert issubclass(classes["ClearOnSkip"], api.AsyncScheduler)
    assert issubclass(classes["LifeGuard"], api.AsyncScheduler)

    def rows(workload, impl):
        return run_workload(workload, impl).table

    resubmit = build_scenario("resubmit")
    guard = api.Implementation("doc-life-guard", "the page's example", scheduler=classes["LifeGuard"])
    upstream = rows(resubmit, resolve("upstream", allow_import=False))
    assert rows(resubmit, guard).equals(rows(resubmit, resolve("life-guard", allow_import=False)))
    assert not rows(resubmit, guard).equals(upstream)  # the guard changes something here
    reentry = build_scenario("reentry")
    clear = api.Implementation("doc-clear", "the page's example", scheduler=classes["ClearOnSkip"])
    assert not rows(reentry, clear).equals(rows(reentry, resolve("upstream", allow_import=False)))
