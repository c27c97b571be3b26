"""specreplay.cli: the click commands, the only place that imports rich.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> **cli**; each command parses, calls one library function, turns library errors
into exit code 2, and renders.
"""
