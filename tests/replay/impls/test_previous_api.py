"""The public hook API keeps its word (impls/hook_api.py).

Implementations written against the previous hook tables (tests/replay/impls/previous_api/, as
their authors wrote them for specreplay 0.2) load with `--impl module:attr`, warn once per hook in
the old form, and run exactly as their twins written in the current form: the same trace row for
row, the same findings. A hook no version of the API had is refused when the implementation is
loaded: one line naming the hook and the signature expected, exit 2, nothing recorded, no finding.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.api import AsyncScheduler, GPUModelRunner, Implementation
from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.hook_api import API_VERSION, PREVIOUS_FORMS, HookDeprecationWarning, checked
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workflows.record import pick_workload
from specreplay.traces.errors import InputError
from specreplay.traces.io import read_trace

PREVIOUS = Path(__file__).parent / "previous_api"


# ------------------------------------------------------------------ the twins, in the current form
class DropsStaleNow(AsyncScheduler):
    def discard_output(self, req, stale, generated):
        return super().discard_output(req, stale, generated) or stale


class CountsOutputsNow(AsyncScheduler):
    def take_output(self, req, n, generated):
        self.outputs_seen = getattr(self, "outputs_seen", 0) + 1
        return super().take_output(req, n, generated)


class NoCachedDraftsNow(GPUModelRunner):
    def scatter_prev_sampled(self, ids, token_at, token_rows, draft_at, draft_slots, rows, token_of, draft_of):
        super().scatter_prev_sampled(ids, token_at, token_rows, [], [], rows, token_of, [])


#: --impl of the previous form -> (its twin, the hooks it warns about, a scenario where it matters)
CASES = {
    "drops_stale:DropsStale": (Implementation("t", "", scheduler=DropsStaleNow), {"discard_output"}, "shared-prefix"),
    "counts_outputs:CountsOutputs": (Implementation("t", "", scheduler=CountsOutputsNow), {"take_output"}, "reentry"),
    "no_cached_drafts:NoCachedDrafts": (
        Implementation("t", "", runner=NoCachedDraftsNow),
        {"scatter_prev_sampled"},
        "reentry",
    ),
    "both:BOTH": (
        Implementation("t", "", scheduler=DropsStaleNow, runner=NoCachedDraftsNow),
        {"discard_output", "scatter_prev_sampled"},
        "streaming-preempt",
    ),
}


@pytest.fixture
def user_folder(monkeypatch):
    """The previous-API implementations are the user's own modules, importable as theirs are."""
    monkeypatch.syspath_prepend(str(PREVIOUS))
    for name in ("drops_stale", "counts_outputs", "no_cached_drafts", "both", "wrong_signature", "subclasses_old_path"):
        monkeypatch.delitem(__import__("sys").modules, name, raising=False)


@pytest.mark.parametrize("spec", list(CASES))
def test_an_implementation_of_the_previous_api_runs_as_its_current_twin(tmp_path, user_folder, spec):
    twin, hooks, scenario = CASES[spec]
    out = tmp_path / "old.parquet"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(main, ["record", "--scenario", scenario, "--impl", spec, "-o", str(out)])
    assert result.exit_code == 0, result.output
    warned = [str(w.message) for w in caught if issubclass(w.category, HookDeprecationWarning)]
    # One warning per old-form hook, naming the form to write and the version that removes the old one.
    assert {m.split("(")[0].rsplit(".", 1)[1] for m in warned} == hooks, warned
    assert all(" until 0.4: write " in m for m in warned), warned
    old = read_trace(out)
    new = run_workload(pick_workload(scenario=scenario), twin)
    diff = diff_traces(old, new)
    assert diff.same, (diff.first, dict(diff.fields))
    assert old.outcome.status == new.outcome.status


def test_the_old_forms_change_what_runs_where_they_should(tmp_path, user_folder):
    """The adapted hooks really run: dropping every stale output and scattering no drafts part
    from upstream on the scenarios chosen for them (a test of the twins, not of nothing)."""
    for spec in ("drops_stale:DropsStale", "no_cached_drafts:NoCachedDrafts"):
        twin, _, scenario = CASES[spec]
        upstream = run_workload(pick_workload(scenario=scenario), resolve("upstream", allow_import=False))
        assert not diff_traces(upstream, run_workload(pick_workload(scenario=scenario), twin)).same, spec


def test_the_trace_names_the_users_class(tmp_path, user_folder):
    out = tmp_path / "t.parquet"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HookDeprecationWarning)
        result = CliRunner().invoke(
            main, ["record", "--scenario", "reentry", "--impl", "no_cached_drafts:NoCachedDrafts", "-o", str(out)]
        )
    assert result.exit_code == 0, result.output
    assert read_trace(out).impl.runner == "no_cached_drafts.NoCachedDrafts"


def test_a_hook_no_api_had_is_refused_in_one_line_before_anything_runs(tmp_path, user_folder):
    out = tmp_path / "never.parquet"
    result = CliRunner().invoke(
        main, ["record", "--scenario", "reentry", "--impl", "wrong_signature:WrongSignature", "-o", str(out)]
    )
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert "wrong_signature.WrongSignature.discard_output(self, req)" in message
    assert f"hook API {API_VERSION} calls discard_output(req, stale, generated)" in message
    assert "changed in API 0.3" in message
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing recorded, so no finding either


def test_every_previous_form_adapts_to_the_current_call():
    """Each entry of PREVIOUS_FORMS: a class written in that form is adapted (one warning), and
    its adapter takes the arguments the current API passes."""
    from specreplay.replay import api

    for form in PREVIOUS_FORMS:
        base = getattr(api, form.owner)
        params = ", ".join(("self", *form.params))
        namespace: dict = {}
        exec(f"def {form.hook}({params}):\n    return 'old form ran'", namespace)
        user = type("UserClass", (base,), {form.hook: namespace[form.hook], "__module__": "user_module"})
        with pytest.warns(HookDeprecationWarning, match=form.hook):
            adapted = checked(user)
        assert adapted is not user and adapted.__qualname__ == "UserClass" and adapted.__module__ == "user_module"
        current = [p for p in __import__("inspect").signature(getattr(base, form.hook)).parameters if p != "self"]
        assert getattr(adapted, form.hook)(None, *range(len(current))) == "old form ran"


def test_the_current_forms_and_specreplays_own_variants_pass_unchanged():
    with warnings.catch_warnings():
        warnings.simplefilter("error", HookDeprecationWarning)
        for cls in (DropsStaleNow, CountsOutputsNow, NoCachedDraftsNow):
            assert checked(cls) is cls
        for impl in (resolve(n, allow_import=False) for n in ("upstream", "pr30796", "sched-clear", "life-guard")):
            for part in (impl.scheduler, impl.runner):
                assert part is None or checked(part) is part


def test_a_mismatch_is_bad_input_not_a_finding():
    class TooMany(GPUModelRunner):
        def on_reentry(self, out, rid, extra):
            return False

    with pytest.raises(InputError, match=r"on_reentry\(self, out, rid, extra\) does not take"):
        checked(TooMany)


def test_a_class_handed_over_in_python_is_held_to_the_api_too():
    """Not only --impl: an Implementation built in Python is checked when its run builds it."""

    class NoStale(AsyncScheduler):
        def discard_output(self, req):
            return False

    with pytest.raises(InputError, match=r"NoStale\.discard_output\(self, req\) does not take"):
        run_workload(pick_workload(scenario="reentry"), Implementation("py", "", scheduler=NoStale))


def test_the_old_import_paths_are_re_exports_that_warn():
    import importlib
    import sys

    from specreplay.replay import api
    from specreplay.replay.families.sglang import setup

    for old in ("specreplay.replay.impls.variants", "specreplay.replay.engines.sglang_setup"):
        sys.modules.pop(old, None)
        with pytest.warns(FutureWarning, match="goes in 0.4.0"):
            module = importlib.import_module(old)
        if old.endswith("variants"):
            assert module.LifeGuardScheduler is api.LifeGuardScheduler
        else:
            assert module.prepare is setup.prepare


def test_a_variant_subclassed_from_its_old_path_runs_as_the_variant(tmp_path, user_folder):
    out = tmp_path / "old.parquet"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        result = CliRunner().invoke(
            main, ["record", "--scenario", "reentry", "--impl", "subclasses_old_path:GuardedScheduler", "-o", str(out)]
        )
    assert result.exit_code == 0, result.output
    new = run_workload(pick_workload(scenario="reentry"), resolve("life-guard", allow_import=False))
    diff = diff_traces(read_trace(out), new)
    assert diff.same, (diff.first, dict(diff.fields))
