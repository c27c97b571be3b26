"""specreplay's benchmark suite (issue 5): `python -m benchmarks.run [--quick]`."""
