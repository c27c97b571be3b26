"""`specreplay record`, `replay`, `recover` and `compare`: run workloads through implementations into traces.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> **cli**. Each command parses its flags, calls one function of
`replay/workflows/record.py` (which owns the journal next to the output), and prints a line or a
table: what it wrote and what the checker says of it.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from specreplay.cli.common import (
    CONTEXT,
    EXIT_FINDINGS,
    console,
    device_option,
    drafter_option,
    engine_option,
    executor_option,
    format_option,
    handle_errors,
    impl_option,
    oracle_option,
    prefix_caching_option,
    print_table,
    progress,
    runner_option,
    trace_argument,
    trace_impl_option,
    vllm_version_option,
    workload_options,
)
from specreplay.replay.engines.registry import DEFAULT_ENGINE
from specreplay.replay.workflows.record import (  # light: the engines load when a command runs
    DEFAULT_COMPARE,
    FLUSH_EVERY,
)
from specreplay.traces.pseudonym import MODES as TOKEN_MODES

flush_option = click.option(
    "--flush-every",
    type=click.IntRange(min=1),
    default=FLUSH_EVERY,
    show_default=True,
    help="Steps between appends of settled rows to OUTPUT.partial while recording (and at least every "
    "0.5 s); a crash keeps them (`specreplay recover`).",
)
output_option = click.option(
    "-o", "--output", type=click.Path(path_type=Path), required=True, help="Trace file to write (.parquet)."
)


def _summary(recorded) -> None:
    from specreplay.cli.render import code_counts, unchecked_note
    from specreplay.replay.check.findings import EMPTY_NOTE, verdict

    trace, findings, output = recorded.trace, recorded.findings, recorded.path
    outcome = str(trace.outcome.status)
    if trace.outcome.crashed:  # the engine died: where and of what, as the E1 finding says it
        outcome += f" at step {trace.outcome.step}: {trace.outcome.message or ''}"
    word = verdict(findings, trace.num_steps)  # no step recorded: never ok
    line = f"wrote {output}: {trace.num_steps} steps, {trace.num_rows} rows, outcome {outcome}; check: {word}"
    note = unchecked_note(recorded.unchecked, trace.impl.runner_family)  # a live engine's trace: no ground truth
    if not trace.num_steps:
        line += f" ({EMPTY_NOTE})"
    elif findings:
        line += f" ({code_counts(findings)})" + (f"; {note}" if note else "") + f"; see `specreplay diff {output}`"
    elif note:
        line += f" ({note})"
    click.echo(line)


def _exit_if_crashed(recorded) -> None:
    """The engine died (outcome crashed: a vLLM assert, an exception the implementation raised):
    the trace is written, and the run failed, exit 1."""
    if recorded.trace.outcome.crashed:
        sys.exit(EXIT_FINDINGS)


@click.command(context_settings=CONTEXT)
@workload_options
@impl_option
@engine_option
@runner_option
@drafter_option
@vllm_version_option
@prefix_caching_option
@executor_option
@device_option
@click.option(
    "--model",
    default=None,
    help="--engine vllm: a model with real weights (folder or hub name); "
    "default: a tiny dummy-weight model written on the fly.",
)
@output_option
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=None,
    help="Stop the run after this many engine steps (default: the workload's max_steps).",
)
@flush_option
@click.option(
    "--attach",
    is_flag=True,
    help="Run COMMAND (after `--`: a vLLM server or your script) with the recorder attached to the "
    "vLLM it starts, forward Ctrl-C / SIGTERM to it, and merge what it recorded into OUTPUT.",
)
@click.option(
    "--tokens",
    type=click.Choice(TOKEN_MODES),
    default=None,
    help="With --attach: how the recording writes token ids (SPECREPLAY_TOKENS): the engine's own, or each "
    "through a keyed permutation of the vocabulary drawn for the run (it replays the same; the key is kept "
    "as OUTPUT.key, never in the trace). Default: the command's environment, else plain.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def record(
    scenario,
    workload_file,
    seed,
    impl_name,
    engine,
    runner,
    drafter,
    vllm_version,
    prefix_caching,
    executor,
    device,
    model,
    output,
    max_steps,
    flush_every,
    attach,
    tokens,
    command,
) -> None:
    """Run a workload through an implementation and record both views to a Parquet trace; or,
    with --attach, record your own vLLM under its own traffic.

    While it runs, settled rows go to OUTPUT.partial every --flush-every steps and on any error, so
    a crash or a kill keeps them: `specreplay recover OUTPUT.partial` turns them into a trace.

    An exception the implementation raises (or a vLLM assert) kills the engine, as in vLLM: the
    trace holds the steps up to it, outcome crashed with the exception and its source line, and
    the exit code is 1. Exit 0: the run ended (`specreplay diff` sets its exit code by the
    findings); 2: bad input (a bad --impl, a class of the wrong kind, a bad workload). With
    --attach, 1 also when the command's vLLM recorded no step; on a CPU with
    VLLM_USE_V2_MODEL_RUNNER=1 the command gets TRITON_INTERPRET=1 (Model Runner V2's kernels run
    in Triton's interpreter there).

    \b
    Example:
      specreplay record --scenario reentry --impl pr30796 -o pr30796.parquet
      specreplay record --attach -o run.parquet -- python -m vllm.entrypoints.openai.api_server --model M
    """
    from specreplay.traces.errors import InputError

    if attach or command:
        if not attach:
            raise InputError(f"unexpected argument {command[0]!r}; to record a command's vLLM, give --attach")
        asked = (scenario, workload_file, engine, runner, drafter, vllm_version, executor, model, max_steps)
        if any(asked) or prefix_caching is not None or impl_name != "upstream":
            raise InputError("--attach records the command's vLLM as it runs: no workload, engine or implementation")
        return _record_attached(output, command, tokens)
    if tokens is not None:
        raise InputError("--tokens is how an attached recording writes token ids: give it with --attach")
    from specreplay.replay.workflows.record import pick_workload, record_to

    workload = pick_workload(scenario, workload_file, seed, max_steps, vllm_version, prefix_caching)
    recorded = record_to(
        output,
        workload,
        impl_name,
        executor=executor,
        engine=engine or DEFAULT_ENGINE,
        device=device,
        model=model,
        flush_every=flush_every,
        progress=progress,
        runner=_runner_for(engine, runner),
        drafter=drafter,
    )
    _summary(recorded)
    _exit_if_crashed(recorded)


def _runner_for(engine: str | None, runner: str | None) -> str | None:
    """--runner for every engine: the runner a live vLLM builds, the reference runner a loop
    engine drives (engines/registry.py RUNNERS; each family has a reference model)."""
    return runner


def _record_attached(output: Path, command: tuple[str, ...], tokens: str | None) -> None:
    """The command under the recorder, then its parts merged. Exit 1 when nothing was recorded
    (0 steps: never ok), 3 on specreplay's own failure."""
    from specreplay.cli.merge import report
    from specreplay.replay.workflows.attach import attach_to
    from specreplay.traces.errors import ObserverError

    with _mrv2_interpreter():
        attached = attach_to(output, command, tokens=tokens)
    click.echo(f"{command[0]} exited with status {attached.returncode}")
    report(attached.merged)
    if attached.key is not None:
        click.echo(f"token key: {attached.key} (maps the trace's ids back; it is not in the trace: keep it here)")
    if attached.merged.failures:  # the engine went on; specreplay's recorder did not: its bug, exit 3
        raise ObserverError(f"{attached.merged.failures[0]} (the trace holds what was recorded before it)")
    if not attached.merged.trace.num_steps:
        sys.exit(EXIT_FINDINGS)


@contextlib.contextmanager
def _mrv2_interpreter():
    """The command's environment for Model Runner V2 on a CPU: the user asked for it
    (VLLM_USE_V2_MODEL_RUNNER=1), or their vLLM has no other (0.34.0 on), and there it runs
    Triton's kernels in Triton's interpreter, which must be on from the process's start
    (families/vllm/mrv2/cpu_triton.py): TRITON_INTERPRET=1 for the command, never on a GPU (its
    kernels compile there) and never for a runner not asked for (the recorder does not change
    which runner the user's vLLM picks). Set for the command's start only; this process's
    environment is restored."""
    import os

    from specreplay.replay.families.vllm.setup import serves_mrv2_only

    asked = os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" or serves_mrv2_only()  # 0.34.0 on: always MRV2
    wanted = asked and "TRITON_INTERPRET" not in os.environ
    if not wanted or not _vllm_on_cpu():
        yield
        return
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        os.environ.pop("TRITON_INTERPRET", None)


def _vllm_on_cpu() -> bool:
    """Is this machine's vLLM a CPU platform (the command's is this environment's)? False where
    vLLM is not importable here: the command may run another Python; it is then told by its plugin."""
    try:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()
    except Exception:  # no usable vLLM in this environment: the command's plugin tells, if any
        return False


@click.command(context_settings=CONTEXT)
@trace_argument
@trace_impl_option
@engine_option
@vllm_version_option
@executor_option
@device_option
@output_option
@flush_option
@oracle_option("the replay runs")
@runner_option
@handle_errors
def replay(trace_path, impl_name, engine, vllm_version, executor, device, output, flush_every, oracle, runner) -> None:
    """Replay a recording: its workload, engine config and executor, driven by the tokens and
    drafts it recorded, through the same or another implementation (what-if).

    \b
    Replayed through the implementation it was recorded with, a recording comes back step for
    step; through another, `specreplay diff RECORDING REPLAY` says where they part. A live or
    attached vLLM recording replays on --engine reference (default) or vllm-scheduler, on the
    reference of the runner it recorded (--runner: the other one, the cross-runner what-if). An
    SGLang recording (--engine sglang-scheduler) replays on SGLang's scheduler, on the tokens,
    drafts and accept lengths its worker recorded. One engine family's outcomes never drive the
    other's (--oracle synthetic runs the recording's workload there). Exit 1 when the engine dies
    (outcome crashed: an exception of the implementation, a vLLM assert).

    \b
    Example:
      specreplay replay live.parquet -o same.parquet
      specreplay replay live.parquet --impl sched-clear -o fixed.parquet
      specreplay replay reentry-sglang.parquet -o again.parquet
    """
    from specreplay.replay.workflows.record import replay_to

    replayed = replay_to(
        output,
        trace_path,
        impl_name,
        executor=executor,
        engine=engine,
        device=device,
        flush_every=flush_every,
        progress=progress,
        oracle=oracle,
        vllm_version=vllm_version,
        runner=runner,
    )
    _summary(replayed)
    outcomes = replayed.trace.impl.outcomes
    if outcomes is not None:
        recorded, filled = outcomes.recorded, outcomes.filled
        click.echo(
            f"on the recorded outcomes of {outcomes.source} ({replayed.trace.impl.engine} engine): "
            f"{recorded['tokens']} token positions and {recorded['proposals']} proposals recorded; "
            f"filled by rule: {filled['tokens']} tokens, {filled['drafts']} drafts"
        )
    _exit_if_crashed(replayed)


@click.command(context_settings=CONTEXT)
@click.argument("journal", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Trace file to write (default: the journal's name with .recovered.parquet).",
)
@handle_errors
def recover(journal, output) -> None:
    """Turn the journal of a recording that did not finish (OUTPUT.partial, left by a crash or a
    kill) into a trace: every step flushed before it stopped, outcome `partial`.

    \b
    Example:
      specreplay recover run.parquet.partial -o run.parquet
    """
    from specreplay.replay.workflows.record import recover_to

    recovered = recover_to(journal, output)
    trace, last = recovered.trace, recovered.trace.outcome.step
    click.echo(
        f"wrote {recovered.path}: steps 1..{last}, {trace.num_rows} rows, outcome partial "
        f"(the recording stopped after step {last})"
    )


@click.command(context_settings=CONTEXT)
@workload_options
@click.option(
    "--impls",
    "impl_names",
    default=None,
    help=f"Comma-separated implementations to record side by side [default: {','.join(DEFAULT_COMPARE)}; "
    "on a live Model Runner V2, those with a form for it; on --engine sglang-scheduler, every registered "
    "implementation with an SGLang form].",
)
@engine_option
@runner_option
@drafter_option
@vllm_version_option
@prefix_caching_option
@device_option
@click.option(
    "-o",
    "--output-dir",
    type=click.Path(path_type=Path),
    default=Path("specreplay-traces"),
    show_default=True,
    help="Folder for the traces, one per implementation.",
)
@format_option
@handle_errors
def compare(
    scenario,
    workload_file,
    seed,
    impl_names,
    engine,
    runner,
    drafter,
    vllm_version,
    prefix_caching,
    device,
    output_dir,
    fmt,
) -> None:
    """Record one workload under several implementations and show each one's verdict side by side.

    Exit 0 whatever the verdicts (it is a report); 2 on bad input. `specreplay diff TRACE` shows
    the findings of one of them in full.

    \b
    Example:
      specreplay compare --scenario reentry
      specreplay compare --scenario random --seed 7 --impls upstream,sched-clear
    """
    from specreplay.replay.workflows.record import compare_defaults, compare_to, pick_workload

    live_runner = _runner_for(engine, runner)
    workload = pick_workload(scenario, workload_file, seed, vllm_version=vllm_version, prefix_caching=prefix_caching)
    left_out: list[tuple[str, str]] = []  # (name, why) of the defaults that do not run here
    if impl_names:
        names = [n.strip() for n in impl_names.split(",") if n.strip()]
    else:
        names, left_out = compare_defaults(engine or DEFAULT_ENGINE, live_runner, workload)
    comparison = compare_to(
        output_dir,
        workload,
        names,
        engine=engine or DEFAULT_ENGINE,
        device=device,
        progress=progress,
        runner=live_runner,
        drafter=drafter,
    )
    if fmt == "json":
        import json

        doc = {"workload": comparison.workload.name, "results": comparison.results}
        click.echo(json.dumps(doc | ({"left_out": dict(left_out)} if left_out else {}), indent=2, default=str))
        return
    _compare_table(comparison)
    for name, why in left_out:
        click.echo(f"left out: {name} ({why})")


def _unchecked_why(codes: list[str]) -> str:
    """The reasons the compare table gives for its row's codes not checked."""
    from specreplay.replay.check.coverage import KV_TRUTH, for_the_runner

    by_runner = for_the_runner(codes)
    runner = bool(by_runner)
    truth = [code for code in codes if code not in by_runner]
    kv_only = bool(truth) and all(code in KV_TRUTH for code in truth)  # a forced live run: T1 ran
    return ", ".join(
        ["no KV ground truth" if kv_only else "no ground truth"] * bool(truth) + ["V1 runner codes on MRV2"] * runner
    )


def _compare_table(comparison) -> None:
    from rich.table import Table

    workload = comparison.workload
    table = Table(
        title=f"{workload.name}: {len(workload.requests)} requests, "
        f"{'async' if workload.config.async_scheduling else 'sync'}, "
        f"budget {workload.config.max_num_batched_tokens}, k={workload.config.num_spec_tokens}",
        title_justify="left",
    )
    for column in ("impl", "verdict", "errors", "warnings", "first finding", "trace"):
        table.add_column(column, overflow="fold")
    for row in comparison.results:
        f = row["first"]
        first = "-" if f is None else f"step {f['step']} req {f['request_id']} {f['code']}"
        table.add_row(
            row["impl"],
            row["verdict"]
            + ("" if row["outcome"] == "completed" else f" ({row['outcome']})")
            + (
                f" ({len(row['unchecked'])} not checked: {_unchecked_why(row['unchecked'])})"
                if row["unchecked"]
                else ""
            ),
            str(row["errors"]),
            str(row["warnings"]),
            first,
            row["trace"],
        )
    out = console()
    print_table(out, table)
    out.print("details: specreplay diff TRACE   (exit 1 when it finds errors)")
