"""Attach: run a command that starts vLLM (a server, a script) with the recorder on, then merge.

Where it sits: workflows, over families/vllm/attached.py (what records inside the command's vLLM
processes) and workflows/merge.py. What `specreplay record --attach -o OUT -- COMMAND` calls.

The command runs with `SPECREPLAY_RECORD` set to a parts folder next to the output
(`OUT.parts/`), in a session of its own, so a Ctrl-C at the terminal reaches it once: through
this process, which forwards SIGINT and SIGTERM to it and waits for it to exit. Then the parts
are merged into OUT and the folder removed; if the merge fails the folder stays, for
`specreplay merge`. A folder left by an earlier run is refused rather than mixed in.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specreplay.replay.workflows.merge import Merged, merge_to
from specreplay.traces.errors import InputError

PARTS_SUFFIX = ".parts"
FORWARDED = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Attached:
    merged: Merged
    returncode: int  # the command's exit status (negative: killed by that signal)
    command: list[str]
    key: Path | None = None  # a pseudonymised run's token key, kept beside the trace (never in it)


def parts_folder(output: Path) -> Path:
    return output.with_name(output.name + PARTS_SUFFIX)


def attach_to(
    output: Path,
    command: Sequence[str],
    on_started: Callable[[subprocess.Popen], None] | None = None,
    tokens: str | None = None,
) -> Attached:
    """Run `command` with the recorder attached and merge what it recorded into `output`.
    `tokens`: the token mode (traces/pseudonym.py; None: the command's environment says)."""
    from specreplay.replay.families.vllm.attached import RECORD_ENV, RUN_ENV
    from specreplay.traces.pseudonym import TOKENS_ENV, key_path

    if not command:
        raise InputError("--attach needs a command after `--`, e.g. record --attach -o run.parquet -- python app.py")
    from specreplay.traces.window import WINDOW_ENV

    if os.environ.get(WINDOW_ENV):
        raise InputError(
            f"record --attach records the whole run; {WINDOW_ENV} is for a flight recorder: start the "
            f"command yourself with SPECREPLAY_RECORD=DIR and {WINDOW_ENV} set, then `specreplay merge DIR/<dump>`"
        )
    output = Path(output)
    folder = parts_folder(output)
    if folder.exists() and any(folder.iterdir()):
        raise InputError(
            f"{folder} holds the parts of an earlier attached run; merge it (`specreplay merge {folder} -o "
            f"{output}`) or remove it"
        )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # the parts hold prompts: the user's alone
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV}
    env[RECORD_ENV] = str(folder.resolve())
    if tokens is not None:
        env[TOKENS_ENV] = tokens
    try:
        proc = subprocess.Popen(list(command), env=env, start_new_session=True)
    except OSError as exc:
        folder.rmdir()
        raise InputError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
    previous = {sig: signal.getsignal(sig) for sig in FORWARDED}

    def forward(sig, _frame):
        if proc.poll() is None:
            proc.send_signal(sig)

    try:
        for sig in FORWARDED:
            signal.signal(sig, forward)
        if on_started is not None:
            on_started(proc)
        returncode = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not any(folder.glob("*.jsonl")):
        folder.rmdir()
        raise InputError(
            f"{command[0]} exited ({returncode}) without starting a vLLM engine that recorded anything "
            "(is vllm 0.32 installed where it runs, with specreplay's plugin? see `pip show specreplay`)"
        )
    merged = merge_to(folder, output)
    key, drawn = None, Path(key_path(str(folder), merged.run))
    if drawn.exists():  # the parts go; the key that maps their ids back stays
        key = output.with_name(output.name + ".key")
        os.replace(drawn, key)
    shutil.rmtree(folder, ignore_errors=True)
    return Attached(merged, returncode, list(command), key)


__all__ = ["Attached", "attach_to", "parts_folder"]
