"""specreplay.cli: the click commands, the only place that imports rich.

Where it sits: the edge of record -> traces -> replay -> diff; each command parses, calls one
library function, turns library errors into exit code 2, and renders.
"""
