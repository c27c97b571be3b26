"""Errors for bad trace and workload input: one clear line each, turned into exit code 2 by the CLI.

Where it sits: raised by the trace reader (traces) and the workload loader (replay), caught in cli.
"""


class InputError(Exception):
    """Bad input from the user: a file, a name, an option. The message is one line that says what
    was expected, what was found, and what to do."""


class TraceError(InputError):
    """A trace file that cannot be read or fails validation."""


class RecordingError(RuntimeError):
    """specreplay's own recorder produced rows or metadata that fail the trace schema: a bug in
    specreplay (or in an implementation that fills trace columns itself), caught before writing."""
