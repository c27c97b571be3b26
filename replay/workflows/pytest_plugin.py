"""pytest plugin: gate a corpus of golden traces inside your own test suite.

Where it sits: replay -> diff, for a project's tests. Installed with specreplay (entry point
`pytest11`), it provides the `specreplay_gate` fixture:

    def test_my_scheduler_keeps_the_goldens(specreplay_gate):
        specreplay_gate(impl="mypkg.sched:Fixed", paths=["tests/goldens"], allow_changed=True)

It fails with the findings as the assertion message. Importing it imports nothing heavy.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def gate_or_fail(
    impl: str | None = None,
    paths: list[str | Path] | None = None,
    fail_on: str = "error",
    allow_changed: bool = False,
    jobs: int = 1,
):
    """Run the gate; raise AssertionError naming every failing trace and its first finding."""
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
        raise AssertionError("\n".join(lines))
    return results


@pytest.fixture
def specreplay_gate():
    """A callable: specreplay_gate(impl=None, paths=None, fail_on="error", allow_changed=False, jobs=1)."""
    return gate_or_fail
