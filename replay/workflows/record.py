"""Recording to a file: run a workload through an implementation and write the trace, with the
journal that keeps every settled step if the run dies on the way.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli; what `specreplay record`, `replay`, `recover` and `compare` call.
`record_to` owns the journal's whole life: it lies next to the output (`OUT.parquet.partial`), a
recording refuses to start while an unfinished one there holds steps (they are nobody's to drop),
the engine appends settled rows to it while it runs, and it is removed once the trace is written. An
implementation that raises ends its run as a crash, with a trace like any other (engines/crash.py);
when the run stops on an error (bad input, a failure of specreplay's own), the steps recorded before
it stay in the journal and an input error says how to recover them; `recover_to` turns such a
journal into an ordinary trace (outcome `partial`). An implementation that does not apply to the
workload (`Implementation.why_not`) is refused before anything runs, never replaced by another.
Nothing here prints: progress goes to a callback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specreplay.replay.observers.recorder import FLUSH_EVERY
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError
from specreplay.traces.families import EngineLine
from specreplay.traces.journal import SUFFIX
from specreplay.traces.trace import Trace

#: Steps done so far and the total (0 when unknown), called as the engine goes.
Update = Callable[[int, int], None]
#: Given a label, a context that yields an `Update` (or None: no progress shown). cli.common.progress is one.
ProgressBar = Callable[[str], AbstractContextManager[Update | None]]


def _no_progress(label: str) -> AbstractContextManager[None]:
    return nullcontext(None)


def resolve_impl(name: str, *, allow_import: bool, executor: str | None = None) -> Any:
    """`--impl NAME` as the registry resolves it (impls/registry.py `resolve`); a user's
    `module:attr` is imported in a process made ready for SGLang where it is installed, and its
    hooks are held to the public API there (impls/hook_api.py)."""
    from specreplay.replay.families.sglang.setup import ready_for_user_code
    from specreplay.replay.impls.registry import resolve

    if allow_import and ":" in name:
        ready_for_user_code()
    return resolve(name, allow_import=allow_import, executor=executor)


@dataclass
class Recorded:
    """A trace written to `path`. `findings` runs the checker on first use; `unchecked` names
    the codes it could not run for want of ground truth."""

    path: Path
    trace: Trace

    @functools.cached_property
    def findings(self) -> list:
        from specreplay.replay.check.checker import check_trace

        return check_trace(self.trace)

    @functools.cached_property
    def unchecked(self) -> list[str]:
        """The codes the trace gave no ground truth to check (a live engine's trace)."""
        from specreplay.replay.check.checker import unchecked_codes

        return unchecked_codes(self.trace)


def check_device(device: str) -> None:
    """`cuda` needs CUDA on this machine (torch is imported only to ask)."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda: CUDA is not available on this machine; use --device cpu")


def pick_workload(
    scenario: str | None = None,
    workload_file: Path | None = None,
    seed: int | None = None,
    max_steps: int | None = None,
    vllm_version: str | None = None,
    prefix_caching: bool | None = None,
) -> Workload:
    """Exactly one of a built-in scenario (seed default 0) or a workload file (seed, when given,
    overrides the file's); `max_steps` overrides the workload's own. `vllm_version`: the release
    to model; None: a workload file's own, else the default (families/vllm/setup.py).
    `prefix_caching`: on or off; None: the workload's own."""
    from specreplay.replay.families.vllm.setup import default_vllm_version
    from specreplay.replay.workloads.scenarios import build_scenario
    from specreplay.replay.workloads.workload import load_workload

    if (scenario is None) == (workload_file is None):
        raise InputError("give exactly one of --scenario NAME or --workload FILE")
    if scenario:
        workload = build_scenario(scenario, seed or 0).at_version(vllm_version or default_vllm_version())
    else:
        workload = load_workload(workload_file, default_vllm_version())
        workload = workload if seed is None else replace(workload, seed=seed)
        workload = workload if vllm_version is None else workload.at_version(vllm_version)
    if prefix_caching is not None:
        workload = replace(workload, config=replace(workload.config, enable_prefix_caching=prefix_caching))
    return workload if max_steps is None else replace(workload, max_steps=max_steps)


def record_to(
    output: Path,
    workload: Workload,
    impl: str,
    *,
    allow_import: bool = True,
    executor: str | None = None,
    engine: str = "reference",
    device: str = "cpu",
    model: str | None = None,
    flush_every: int = FLUSH_EVERY,
    progress: ProgressBar | None = None,
    oracle: Any = None,
    runner: str | None = None,
    drafter: str | None = None,
) -> Recorded:
    """Run `workload` through `impl` (a registry name; module:attr too with `allow_import`, i.e.
    typed by the user) on `engine` and write the trace to `output`. `oracle`: a recording's
    outcomes to run with (replay_to), noted in the trace's impl metadata with what it filled.

    While it runs, settled rows go to the journal `output.partial` every `flush_every` steps.
    Refuses to start while an unfinished journal there holds steps. On an InputError from the run
    (the engine refused the workload) the journal keeps what was recorded when it holds steps, and
    the error names it; any other exception leaves it as it is. An exception of the implementation
    is no error here: the run ends as crashed and its trace is written (engines/crash.py).
    On success the journal is removed."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.traces.io import write_trace
    from specreplay.traces.journal import holds_steps

    implementation = resolve_impl(impl, allow_import=allow_import, executor=executor)
    check_device(device)
    journal = _claim_journal(output)
    with (progress or _no_progress)(f"{workload.name} via {implementation.name}") as update:
        try:
            trace = run_workload(
                workload,
                implementation,
                device=device,
                progress=update,
                engine=engine,
                model=model,
                journal=journal,
                flush_every=flush_every,
                runner=runner,
                drafter=drafter,
                oracle=oracle,
            )
        except InputError as exc:
            if journal.exists() and holds_steps(journal):
                raise InputError(
                    f"{exc}; the steps recorded before it are in {journal} (`specreplay recover {journal}`)"
                ) from None
            journal.unlink(missing_ok=True)
            raise
    write_trace(trace, output)
    journal.unlink(missing_ok=True)  # the trace is written: the journal has served its purpose
    return Recorded(output, trace)


def _claim_journal(output: Path) -> Path:
    """The journal path for `output`, free to write: an empty leftover is removed, one holding
    steps (an earlier recording to this path died) is refused."""
    from specreplay.traces.journal import holds_steps, journal_path

    if output.exists() and output.is_dir():
        raise InputError(f"{output}: is a directory; -o takes a file path like out.parquet")
    journal = journal_path(output)
    if journal.exists():
        if holds_steps(journal):  # its rows are not ours to drop
            raise InputError(
                f"{journal}: a recording to {output} did not finish; recover it first "
                f"(`specreplay recover {journal}`) or delete it"
            )
        journal.unlink()  # it died before its first flush: nothing in it
    return journal


def replay_to(
    output: Path,
    source: Path,
    impl: str | None = None,
    *,
    executor: str | None = None,
    engine: str | None = None,
    device: str = "cpu",
    flush_every: int = FLUSH_EVERY,
    progress: ProgressBar | None = None,
    oracle: str | None = None,
    vllm_version: str | None = None,
    runner: str | None = None,
) -> Recorded:
    """Run a trace again through `impl` (default: the trace's own, by registry name only), with
    the engine config and executor that ran it, on the oracle and engine `plan_replay` picks
    (workflows/replaying.py): a live or attached recording on its recorded outcomes.
    `vllm_version`: run as this vLLM release (default: the one the trace ran as); `runner`: the
    runner family (default: the trace's own)."""
    from specreplay.replay.workflows.replaying import may_be_recording, plan_replay
    from specreplay.traces.io import TraceFile, open_trace

    opened = open_trace(source)
    trace: Trace | TraceFile = opened
    if oracle == "recorded" or (oracle is None and may_be_recording(opened.impl)):
        trace = opened.read()  # the outcomes are in the rows; a synthetic replay needs the metadata only
    plan = plan_replay(trace, str(source), engine=engine, oracle=oracle, runner=runner)
    return record_to(
        output,
        plan.workload if vllm_version is None else plan.workload.at_version(vllm_version),
        impl or trace.impl_name,
        allow_import=impl is not None,
        executor=executor or plan.executor,
        engine=plan.engine,
        device=device,
        flush_every=flush_every,
        progress=progress,
        oracle=plan.oracle,
        runner=plan.runner,
    )


def recovered_path(journal: Path) -> Path:
    """Where `recover_to` writes by default: `run.parquet.partial` -> `run.recovered.parquet`."""
    return journal.with_name(Path(journal.name.removesuffix(SUFFIX)).stem + ".recovered.parquet")


def recover_to(journal: Path, output: Path | None = None) -> Recorded:
    """Write the complete steps of an unfinished recording's journal as a trace (outcome
    `partial`) to `output` (default `recovered_path(journal)`); never overwrites a file."""
    from specreplay.traces.io import write_trace
    from specreplay.traces.journal import recover

    output = recovered_path(journal) if output is None else output
    if output.exists():
        raise InputError(f"{output}: exists; choose another path with -o (a trace is never overwritten by recover)")
    trace = recover(journal)
    write_trace(trace, output)
    return Recorded(output, trace)


#: What `compare` records on vLLM's engines when not told (`compare_defaults`).
DEFAULT_COMPARE = ("upstream", "pr30796", "pr30796-copy", "sched-clear")


def compare_defaults(engine: str, runner: str | None, workload: Workload) -> tuple[list[str], list[tuple[str, str]]]:
    """The implementations `compare` records when not told, and those it leaves out with why.
    On vLLM's engines: DEFAULT_COMPARE, less those whose runner form is another family's than
    the one that runs. On another engine's scheduler (SGLang's), where vLLM's variants have no
    form: every registered implementation the engine runs on this workload (its entry's `refuse`),
    so a variant registered with a form for it is compared without being named here."""
    from specreplay.replay.engines.registry import engine as engine_entry
    from specreplay.replay.impls.registry import NotApplicable, registry

    entry = engine_entry(engine)
    if entry.line is EngineLine.VLLM:
        left_out = [
            (name, f"its {entry.runner_form} is for --runner {family}")
            for name, family in runner_mismatch(DEFAULT_COMPARE, engine, runner)
        ]
        return [n for n in DEFAULT_COMPARE if n not in dict(left_out)], left_out
    names, left_out = [], []
    for name, impl in registry().items():
        try:
            entry.refuse(impl, workload.config, f"workload {workload.name!r}")
        except NotApplicable as exc:
            left_out.append((name, exc.reason))
            continue
        except InputError:  # it changes vLLM's classes: no form for this engine
            left_out.append((name, f"no form for --engine {engine}"))
            continue
        names.append(name)
    return names, left_out


@dataclass
class Comparison:
    workload: Workload
    results: list[dict[str, Any]]  # per implementation: verdict, counts, first finding, trace path


def compare_to(
    output_dir: Path,
    workload: Workload,
    impls: Sequence[str],
    *,
    engine: str = "reference",
    device: str = "cpu",
    progress: ProgressBar | None = None,
    runner: str | None = None,
    drafter: str | None = None,
) -> Comparison:
    """Record `workload` through each implementation into `output_dir` (one trace each, named
    after the workload and the implementation) and check each one. Refuses, before recording
    any, when one of them does not apply to the workload (`Implementation.why_not`)."""
    from specreplay.replay.check.findings import verdict

    if not impls:
        raise InputError("--impls: give at least one implementation name")
    from specreplay.replay.engines.registry import engine as engine_entry

    runner = engine_entry(engine).runner_on(runner, workload.config) or runner  # the release's runner
    for name in impls:
        impl = resolve_impl(name, allow_import=True)
        if impl.why_not(workload.config) is not None:
            others = ",".join(n for n in impls if resolve_impl(n, allow_import=True).why_not(workload.config) is None)
            hint = f" (--impls {others} apply)" if others else ""
            raise InputError(
                f"{name} does not apply to workload {workload.name!r}: {impl.why_not(workload.config)}{hint}"
            )
    other_runner = runner_mismatch(impls, engine, runner)
    if other_runner:
        name, family = other_runner[0]
        fits = [n for n in impls if n not in dict(other_runner)]
        hint = f" (--impls {','.join(fits)} run on it)" if fits else ""
        from specreplay.replay.engines.registry import engine as engine_entry

        entry = engine_entry(engine)
        raise InputError(
            f"{name}'s {entry.runner_form} subclasses the {family} runner; --runner {entry.runner_built(runner)} "
            "builds another: "
            f"pass --runner {family}{hint}"
        )
    if output_dir.exists() and not output_dir.is_dir():
        raise InputError(f"{output_dir}: exists and is not a folder")
    results = []
    for name in impls:
        path = output_dir / f"{workload.name}-{name.replace(':', '_').replace('/', '_')}.parquet"
        recorded = record_to(
            path, workload, name, engine=engine, device=device, progress=progress, runner=runner, drafter=drafter
        )
        findings, trace = recorded.findings, recorded.trace
        first = next((f for f in findings if f.severity == "error"), findings[0] if findings else None)
        results.append(
            {
                "impl": name,
                "executor": trace.impl.executor,
                "verdict": verdict(findings, trace.num_steps),
                "unchecked": recorded.unchecked,
                "errors": sum(f.severity == "error" for f in findings),
                "warnings": sum(f.severity == "warning" for f in findings),
                "first": None if first is None else first.to_dict(),
                "trace": str(path),
                "outcome": trace.outcome.status,
            }
        )
    return Comparison(workload, results)


def runner_mismatch(impls: Sequence[str], engine: str, runner: str | None) -> list[tuple[str, str]]:
    """(name, family) of each implementation whose runner form is for another runner family than
    the one `engine` and `runner` run (pr30796 edits V1's runner: MRV2 has no such state to change):
    on a live vLLM its real runner form, on a loop engine its reference runner form."""
    from specreplay.replay.engines.registry import engine as engine_entry

    entry = engine_entry(engine)
    built = entry.runner_built(runner)
    out = []
    for name in impls:
        own = entry.runner_form_family(resolve_impl(name, allow_import=True))
        if own is not None and own != built:
            out.append((name, own))
    return out
