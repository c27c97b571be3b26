"""specreplay's error vocabulary: bad input (one clear line, exit code 2) and its own bugs.

Where it sits: traces is the base layer that every other part imports (cli, and every stage of
replay), so the errors the whole application raises live here: the trace reader and the
workload loader raise `InputError`, the engines and workflows raise it for a bad name, option or
implementation, and the CLI turns it into its one line and exit code 2.
"""


class InputError(Exception):
    """Bad input from the user: a file, a name, an option. The message is one line that says what
    was expected, what was found, and what to do."""


class TraceError(InputError):
    """A trace file that cannot be read or fails validation."""


class RecordingError(RuntimeError):
    """specreplay's own recorder produced rows or metadata that fail the trace schema: a bug in
    specreplay (or in an implementation that fills trace columns itself), caught before writing."""


class ObserverError(RuntimeError):
    """An observer failed while it watched an engine: a failure of specreplay itself, never a
    finding about the engine under test (the CLI says so, exit code 3)."""


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}


def one_line(text: str) -> str:
    """A message that stays on one line whatever a hostile file put in it (control characters,
    newlines in a column name) shown escaped."""
    return text.translate(_CONTROL)
