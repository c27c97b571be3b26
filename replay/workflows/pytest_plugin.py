"""pytest plugin: gate a corpus of golden traces inside your own test suite.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli, for a project's tests. Installed with specreplay (entry point
`pytest11`), it provides the `specreplay_gate` fixture:

    def test_my_scheduler_keeps_the_goldens(specreplay_gate):
        specreplay_gate(impl="mypkg.sched:Fixed", paths=["tests/goldens"], allow_changed=True)

It fails with the findings as the assertion message. A golden the implementation does not apply
to (`n/a`: an AsyncScheduler subclass on a synchronous golden, ...) ran nothing: when none
applied, the test is skipped with the reasons; when some did, the others' n/a is a warning.
Importing it imports nothing heavy.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest


class GoldenNotApplicable(UserWarning):
    """Goldens the implementation does not apply to: the gate ran nothing for them."""


def gate_or_fail(
    impl: str | None = None,
    paths: list[str | Path] | None = None,
    fail_on: str = "error",
    allow_changed: bool = False,
    jobs: int = 1,
):
    """Run the gate; raise AssertionError naming every failing trace and its first finding.
    Skip the test (pytest.skip, with the reasons) when no golden applies to the implementation;
    warn (`GoldenNotApplicable`) naming the n/a ones when only some do."""
    from specreplay.replay.workflows.gate import GateOptions, corpus_dir, run_gate

    targets = [Path(p) for p in paths] if paths else [corpus_dir()]
    results = run_gate(targets, GateOptions(impl=impl, fail_on=fail_on), jobs=jobs)
    bad = [r for r in results if r.failed(allow_changed)]
    if bad:
        lines = [f"specreplay gate: {len(bad)} of {len(results)} traces did not pass"]
        for r in bad:
            lines.append(f"  {Path(r.path).name}: {r.result}: {r.message}")
            for f in r.findings[:5]:
                lines.append(f"    {f.severity} {f.code} step {f.step} request {f.request_id}: {f.message}")
        raise AssertionError("\n".join(lines + _not_applicable(results)))
    if results and all(r.result == "n/a" for r in results):
        pytest.skip("\n".join([f"specreplay gate: no golden applies to {results[0].impl}"] + _not_applicable(results)))
    skipped = _not_applicable(results)
    if skipped:
        warnings.warn(
            GoldenNotApplicable("\n".join(["specreplay gate: not applicable, nothing ran:"] + skipped)), stacklevel=2
        )
    return results


def _not_applicable(results) -> list[str]:
    return [f"  {Path(r.path).name}: n/a: {r.message}" for r in results if r.result == "n/a"]


@pytest.fixture
def specreplay_gate():
    """A callable: specreplay_gate(impl=None, paths=None, fail_on="error", allow_changed=False, jobs=1)."""
    return gate_or_fail
