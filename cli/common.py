"""Shared CLI pieces: error translation, shared options, consoles, progress.

Where it sits: cli. Library functions raise `InputError`; `handle_errors` turns it into one line
on stderr and exit code 2. Options that more than one command takes are declared here, once.
Rendering to a console happens in the command modules, here and in cli/render.py only.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from specreplay.replay.engines.registry import RUNNERS, choosable_engines
from specreplay.replay.families.vllm.drafters import DRAFTERS
from specreplay.replay.workloads.config import MODELLED_VERSIONS
from specreplay.traces.errors import InputError, one_line
from specreplay.traces.header import ImplHeader

EXIT_OK, EXIT_FINDINGS, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input -> `error: ...` and exit 2, never a traceback. Anything else is a specreplay bug:
    one line and exit 3 (SPECREPLAY_DEBUG=1 shows the traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            click.echo(f"error: {one_line(str(exc))}", err=True)
            sys.exit(EXIT_INPUT)
        except OSError as exc:  # a path that cannot be read or written: the user's to fix
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"error: {one_line(where + (exc.strerror or str(exc)))}", err=True)
            sys.exit(EXIT_INPUT)
        except Exception as exc:
            if os.environ.get("SPECREPLAY_DEBUG"):
                raise
            text = one_line(str(exc))[:200]
            click.echo(
                f"error: internal error, {type(exc).__name__}: {text} (a specreplay bug: please report it "
                "with the input; SPECREPLAY_DEBUG=1 shows the traceback)",
                err=True,
            )
            sys.exit(EXIT_INTERNAL)

    return wrapper


def console(stderr: bool = False):
    from rich.console import Console

    width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else None
    # markup off: names and messages come from trace files, and '[...]' in them is text, not style
    return Console(stderr=stderr, width=width, no_color="NO_COLOR" in os.environ, highlight=False, markup=False)


#: The widest a table is drawn where the output is no terminal (a CI log, a file, a pipe):
#: at its natural width up to this, its wrapping cells wrapped beyond it.
PIPED_TABLE_WIDTH = 200


def print_table(out: Any, table: Any) -> None:
    """Print a rich table on `out`. Where the output is no terminal and COLUMNS names no width,
    rich assumes 80 columns and squeezes a wider table into them, its unwrappable cells cut to
    "…" (a request's story on Model Runner V2 has 17 columns): such a table is drawn at the width
    it needs instead, which a log shows whole."""
    if out.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        out.print(table)
        return
    from rich.measure import Measurement

    span = Measurement.get(out, out.options.update_width(10 * PIPED_TABLE_WIDTH), table)
    width = max(span.minimum, min(span.maximum, PIPED_TABLE_WIDTH))
    if width <= out.width:
        out.print(table)
        return
    before = out.width
    out.width = width
    try:
        out.print(table)
    finally:
        out.width = before


# Shared options and arguments, declared once: every command that takes one uses these.
format_option = click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Output format."
)
fail_on_option = click.option(
    "--fail-on",
    type=click.Choice(["error", "warning", "never"]),
    default="error",
    show_default=True,
    help="Exit 1 when findings at or above this severity exist.",
)
impl_option = click.option(
    "--impl",
    "impl_name",
    default="upstream",
    show_default=True,
    help="Implementation: a name from `specreplay impls`, or module:attr.",
)
trace_impl_option = click.option(
    "--impl",
    "impl_name",
    default=None,
    help="Implementation: a name from `specreplay impls`, or module:attr (default: the trace's own).",
)
device_option = click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="Where the reference runner's tensors live.",
)
engine_option = click.option(
    "--engine",
    type=click.Choice(choosable_engines()),
    default=None,
    help="reference: specreplay's models of vLLM (--vllm-version); vllm-scheduler: the installed vLLM's real "
    "scheduler with the reference runner; vllm: a live tiny vLLM engine, real scheduler and real "
    "model runner (--executor multiproc: engine core in its own process); sglang-scheduler: SGLang 0.5.23's "
    "real scheduler in its own event loop with the reference SGLang worker (its own environment: "
    "scripts/sglang.sh install). Default: reference (replay, gate: the trace's own).",
)
runner_option = click.option(
    "--runner",
    type=click.Choice(list(RUNNERS)),
    default=None,
    help="The model runner: v1 (vLLM's V1 GPUModelRunner) or v2 (Model Runner V2, vllm/v1/worker/gpu/, what GPU "
    "deployments run). --engine vllm builds the real one (default v2, what vLLM picks wherever Triton counts as "
    "present; on a CPU machine specreplay runs Triton's interpreter for it); the other engines drive specreplay's "
    "reference of it (default v1; replay: the trace's own). sglang: the reference SGLang worker, what --engine "
    "sglang-scheduler runs (and only it).",
)
drafter_option = click.option(
    "--drafter",
    type=click.Choice(DRAFTERS),
    default=None,
    help="What --engine vllm drafts with: ngram, ngram_gpu, eagle (a 1-layer EAGLE head) or draft_model (the "
    "tiny model drafting for itself), dummy weights. Default: ngram_gpu under async scheduling, ngram under "
    "sync (vLLM takes ngram with sync scheduling only). The other engines draft with the workload's oracle.",
)
vllm_version_option = click.option(
    "--vllm-version",
    "vllm_version",
    type=click.Choice(MODELLED_VERSIONS),
    default=None,
    help="The vLLM release the engine behaves as: the reference models' and, with --engine "
    "vllm-scheduler or vllm, the installed one's. Default: a trace's own (replay, gate, shrink), "
    "else the installed vLLM's when modelled, else the newest modelled.",
)
prefix_caching_option = click.option(
    "--prefix-caching/--no-prefix-caching",
    "prefix_caching",
    default=None,
    help="vLLM's automatic prefix caching for the run (its default: on): a new or resumed request starts "
    "from the longest cached prefix of its tokens. Default: the workload's own (a scenario's: on).",
)
executor_option = click.option(
    "--executor",
    type=click.Choice(["inproc", "multiproc"]),
    default=None,
    help="How the SchedulerOutput reaches the worker: the shared object (inproc) or a "
    "private copy (multiproc). Default: the implementation's own.",
)


def oracle_option(runs: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--oracle, for a command that runs a trace again; `runs` names what runs (workflows/replaying.py)."""
    return click.option(
        "--oracle",
        type=click.Choice(["recorded", "synthetic"]),
        default=None,
        help=f"recorded: {runs} on the trace's own sampled tokens and drafts (the default for a live or "
        "attached vLLM recording, on --engine reference or vllm-scheduler; for an SGLang trace, on "
        "--engine sglang-scheduler; and for a replay or shrink of one); "
        "synthetic: on the workload's seeded model (the default for every other trace).",
    )


jobs_option = click.option(
    "--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Worker processes on this machine."
)
trace_argument = click.argument("trace_path", type=click.Path(path_type=Path))


def workload_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--scenario or --workload, and --seed: what `pick_workload` takes."""
    fn = click.option(
        "--seed",
        type=click.IntRange(min=0),
        default=None,
        help="Seed of the workload: a scenario's (default 0), or overriding a workload file's.",
    )(fn)
    fn = click.option(
        "--workload", "workload_file", type=click.Path(path_type=Path), help="A workload file (TOML or JSON)."
    )(fn)
    return click.option("--scenario", help="A built-in scenario (see `specreplay scenarios`).")(fn)


@contextmanager
def progress(label: str) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on a terminal (stderr), nothing when piped."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("step {task.completed}"),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            if done % 16 == 0:
                bar.update(task, completed=done)

        yield update


def ran_line(impl: ImplHeader) -> str:
    """What ran, from a trace's implementation metadata: the scheduler and runner classes (module
    and qualified name), the executor, the engine and its models."""
    executor = "?" if "executor" in impl.omitted else impl.executor  # None: in-process
    family = f" ({impl.runner_family})" if impl.runner_family else ""  # named from schema v5 on
    return (
        f"scheduler {_known(impl.scheduler)}, runner {_known(impl.runner)}{family}, "
        f"executor {executor}, engine {impl.engine_or_reference()} ({_known(impl.models)})"
    )


def _known(value: str | None) -> str:
    return "?" if value is None else value
