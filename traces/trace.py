"""The in-memory trace: a pyarrow table in the one schema plus its decoded metadata.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli. The recorder builds a `Trace`, the writer stores it, the reader returns
it, the checker and the diff consume it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from specreplay.traces import schema
from specreplay.traces.header import Config, ImplHeader, Inputs, Outcome, Volatile, WorkloadHeader, coerce


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specreplay")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0+source"


_PARTS: dict[str, type[Any]] = {
    "workload": WorkloadHeader,
    "config": Config,
    "impl": ImplHeader,
    "outcome": Outcome,
    "volatile": Volatile,
    "inputs": Inputs,
}


@dataclass
class Trace:
    """A recorded run: one row per (step, request), see `schema.COLUMNS`, and its header (the
    typed metadata of traces.header). A plain mapping given for a header part is read as a file's
    would be (tests write headers by hand)."""

    table: pa.Table
    workload: WorkloadHeader
    config: Config
    impl: ImplHeader
    outcome: Outcome
    seed: int = 0
    device: str = "cpu"
    version: str = field(default_factory=package_version)
    schema_version: int = schema.SCHEMA_VERSION
    volatile: Volatile = field(default_factory=Volatile)
    inputs: Inputs | None = None  # live and attached vLLM runs: the recorded inputs

    def __setattr__(self, name: str, value: Any) -> None:
        # The constructor, `dataclasses.replace` and the journal's recover all assign here: a
        # header part given as a mapping is read as a file's would be, so parts stay typed.
        part = _PARTS.get(name)
        if part is not None and isinstance(value, Mapping):
            if name == "inputs" and not value:  # no inputs, as the writer skips an empty object
                value = None
            else:
                value = coerce(part, value)
        super().__setattr__(name, value)

    @property
    def impl_name(self) -> str:
        return self.impl.name if self.impl.name is not None else "?"

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    @property
    def num_steps(self) -> int:
        if self.table.num_rows == 0:
            return 0
        return int(pa.compute.max(self.table["step"]).as_py())

    def batches(self, columns: tuple[str, ...] | None = None) -> list[pa.RecordBatch]:
        """The rows as record batches with the given columns (all by default): the same call a
        trace file (traces.io) answers by streaming, so readers take either."""
        table = self.table if columns is None else self.table.select(list(columns))
        return table.to_batches(max_chunksize=1 << 20)

    def metadata(self) -> dict[bytes, bytes]:
        """Key/value metadata as stored in the Parquet file."""

        def js(value: Any) -> bytes:
            return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

        meta = {
            schema.META_SCHEMA_VERSION: str(self.schema_version).encode(),
            schema.META_VERSION: self.version.encode(),
            schema.META_WORKLOAD: js(self.workload.to_dict()),
            schema.META_CONFIG: js(self.config.to_dict()),
            schema.META_IMPL: js(self.impl.to_dict()),
            schema.META_SEED: str(self.seed).encode(),
            schema.META_OUTCOME: js(self.outcome.to_dict()),
            schema.META_DEVICE: self.device.encode(),
            schema.META_VOLATILE: js(self.volatile.to_dict()),
        }
        if self.inputs is not None:
            meta[schema.META_INPUTS] = js(self.inputs.to_dict())
        return meta

    def content_equals(self, other: Trace) -> bool:
        """Same rows and same non-volatile metadata (creation time, host and device are ignored)."""
        mine = {k: v for k, v in self.metadata().items() if k not in (schema.META_VOLATILE, schema.META_DEVICE)}
        theirs = {k: v for k, v in other.metadata().items() if k not in (schema.META_VOLATILE, schema.META_DEVICE)}
        return mine == theirs and self.table.equals(other.table)
