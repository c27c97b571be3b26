"""`python -m specreplay.cli`: the same as the `specreplay` command."""

from specreplay.cli.main import main

main()
