"""The `specreplay` command group: registers one command module per subcommand.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> **cli**. Importing this module imports click and nothing heavy; each command
imports what it needs when it runs, so `specreplay --help` and `specreplay diff` never import torch.
"""

from __future__ import annotations

import click

from specreplay.cli import diff, explore, fidelity, gate, listing, merge, record, show, shrink, snapshot
from specreplay.cli.common import CONTEXT


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="specreplay")
def main() -> None:
    """Record, replay and diff the scheduler and worker views of vLLM async scheduling with
    speculative decoding, and name the first step where they part.

    \b
    Example:
      specreplay compare --scenario reentry
      specreplay record --scenario reentry --impl upstream -o reentry.parquet
      specreplay diff reentry.parquet
    """


for command in (
    record.record,
    record.replay,
    record.recover,
    merge.merge,
    snapshot.snapshot,
    record.compare,
    diff.diff,
    gate.gate,
    explore.explore,
    shrink.shrink,
    fidelity.fidelity,
    show.show,
    show.export,
    listing.info,
    listing.scenarios,
    listing.impls,
    listing.codes,
    listing.schema,
):
    main.add_command(command)
