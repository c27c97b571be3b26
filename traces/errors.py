"""Errors for bad trace and workload input: one clear line each, turned into exit code 2 by the CLI.

Where it sits: raised by the trace reader (traces) and the workload loader (replay), caught in cli.
"""


class InputError(Exception):
    """Bad input from the user: a file, a name, an option. The message is one line that says what
    was expected, what was found, and what to do."""


class TraceError(InputError):
    """A trace file that cannot be read or fails validation."""
