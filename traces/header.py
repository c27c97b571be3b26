"""The typed trace header: what a trace's metadata holds, as frozen values.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli. A `Trace` (traces.trace) carries one value of each class here beside its
rows; traces.io writes them into the Parquet key/value metadata and reads them back, validated, so
that everything downstream reads attributes (`trace.outcome.status`, `trace.impl.engine`) instead of
string keys.

Each value is written as the JSON object it was read from, byte for byte: an optional field is
`None` when the file (or the writer) left the key out, and keys this specreplay does not know are
kept in `extra`. So `write(read(f))` keeps the metadata of every file, old ones included.

The engine config (`Config`) is recorded here as the file states it, every knob optional: the
engine config a run is built from (`replay.workloads.config.EngineConfig`, with its defaults and
the vLLM releases it models) belongs to replay, which traces must not import at module level.
`EngineConfig.from_dict(header.config.to_dict())` builds one; the reader runs exactly that check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from specreplay.traces.errors import TraceError

_Part = TypeVar("_Part", bound="_Json")


def _kind(kind: str) -> Any:
    """A header field (None: not recorded) of a kind the reader checks: "str", "int", "bool",
    "strs" (a list of text), "map" (an object), "ids" (an object of token id lists), or "any" (any
    JSON value, validated where used)."""
    return field(default=None, metadata={"kind": kind})


def _valid(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "strs":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if kind == "map":
        return isinstance(value, dict)
    if kind == "ids":
        return isinstance(value, dict) and all(
            isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
            for ids in value.values()
        )
    return True


_SAYS = {
    "str": "is not text",
    "int": "is not an integer",
    "bool": "is not true or false",
    "strs": "is not a list of text",
    "map": "is not a JSON object",
    "ids": "is not a JSON object of token id lists",
}


@dataclass(frozen=True)
class _Json:
    """A JSON object of the metadata: known keys as fields (None: the key was left out), the rest
    in `extra`, and so is a known key written as null unless its field is `NULLABLE` (written even
    when None; `omitted` remembers an old file that lacked one). Subclasses name their part
    (`PART`, for messages) and their nested parts (`NESTED`)."""

    PART: ClassVar[str] = "?"
    NESTED: ClassVar[Mapping[str, type[_Json]]] = {}
    NULLABLE: ClassVar[frozenset[str]] = frozenset()

    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)
    omitted: frozenset[str] = field(default=frozenset(), kw_only=True)

    @classmethod
    def _fields(cls) -> list[dataclasses.Field[Any]]:
        return [f for f in dataclasses.fields(cls) if "kind" in f.metadata]

    @classmethod
    def from_dict(cls: type[_Part], data: Mapping[str, Any], where: str = "trace") -> _Part:
        """The value of a metadata object; a mistyped known key is one `TraceError` line."""
        values: dict[str, Any] = {}
        known = cls._fields()
        for f in known:
            if data.get(f.name) is None:  # left out, or null: the field is None (a null is kept, below)
                continue
            value = data[f.name]
            kind = f.metadata["kind"]
            if not _valid(kind, value):
                raise TraceError(f"{where}: metadata {cls.PART} {f.name} {_SAYS[kind]}")
            nested = cls.NESTED.get(f.name)
            if nested is not None:
                value = nested.from_dict(value, where)
            elif kind == "strs":
                value = tuple(value)
            values[f.name] = value
        names = {f.name for f in known if data.get(f.name) is not None or f.name in cls.NULLABLE}
        extra = {key: value for key, value in data.items() if key not in names}  # a null is written back
        omitted = frozenset(name for name in cls.NULLABLE if name not in data)
        return cls(**values, extra=extra, omitted=omitted)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object as written: the keys read (or set), `extra` included."""
        out: dict[str, Any] = dict(self.extra)
        for f in self._fields():
            value = getattr(self, f.name)
            if value is None and (f.name not in self.NULLABLE or f.name in self.omitted):
                continue
            if isinstance(value, _Json):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return dict(sorted(out.items()))  # as a file holds it (written with sorted keys)


@dataclass(frozen=True)
class Config(_Json):
    """The engine config that ran, as recorded (`specreplay.config`, and a workload's `config`)."""

    PART = "config"

    max_num_batched_tokens: int | None = _kind("int")
    max_num_seqs: int | None = _kind("int")
    num_spec_tokens: int | None = _kind("int")
    async_scheduling: bool | None = _kind("bool")
    block_size: int | None = _kind("int")
    num_blocks: int | None = _kind("int")
    max_model_len: int | None = _kind("int")
    long_prefill_token_threshold: int | None = _kind("int")
    vocab_size: int | None = _kind("int")
    num_lookahead_tokens: int | None = _kind("int")
    vllm_version: str | None = _kind("str")
    enable_prefix_caching: bool | None = _kind("bool")  # absent: off (written before it was modelled)
    eagle_block_drop: bool | None = _kind("bool")
    adaptive_speculation: bool | None = _kind("bool")  # SGLang's; absent: off
    kv_connector: str | None = _kind("str")  # the KV connector an attached recording's engine ran; absent: none


@dataclass(frozen=True)
class WorkloadHeader(_Json):
    """The workload, enough to replay it (`specreplay.workload`). Its requests and events are the
    workload format's own objects, validated by `replay.workloads.workload.Workload.from_dict`."""

    PART = "workload"
    NESTED = {"config": Config}

    name: str | None = _kind("str")
    seed: int | None = _kind("int")
    max_steps: int | None = _kind("int")
    acceptance: Any = _kind("any")
    config: Config | None = _kind("map")
    requests: Any = _kind("any")
    events: Any = _kind("any")


@dataclass(frozen=True)
class OutcomesNote(_Json):
    """A run on a recording's outcomes (`impl.outcomes`, written by replay.engines.run.on_outcomes):
    the recording they came from, its drafter, whether it drained at its end, what the recording
    gave (`recorded`) and what the rules filled (`filled`)."""

    PART = "impl outcomes"

    source: str | None = _kind("str")
    drafter: str | None = _kind("str")
    drains_at_end: bool | None = _kind("bool")
    recorded: Any = _kind("any")
    filled: Any = _kind("any")


#: `ImplHeader.runner_family` of a recording whose runner specreplay does not observe (a fork's,
#: a future release's): its trace holds the scheduler view only, and the worker's codes do not run.
UNOBSERVED_RUNNER = "unobserved"


@dataclass(frozen=True)
class ImplHeader(_Json):
    """The implementation asked and what ran (`specreplay.impl`, from `Implementation.describe`):
    its name, the scheduler and runner classes (module:qualname), the executor (None: in-process),
    the engine, the models' release, and on a recording's outcomes the drafter and the note. An
    attached vLLM's merged trace (replay.workflows.merge) adds its model, run id, the patches
    its observers applied and how it wrote token ids (`tokens`)."""

    PART = "impl"
    NESTED = {"outcomes": OutcomesNote}
    NULLABLE = frozenset({"executor"})

    name: str | None = _kind("str")
    scheduler: str | None = _kind("str")
    runner: str | None = _kind("str")
    runner_family: str | None = _kind("str")  # v1 / v2 (replay/engines/registry.py); absent: v1
    executor: str | None = _kind("str")
    engine: str | None = _kind("str")
    models: str | None = _kind("str")
    drafter: str | None = _kind("str")
    outcomes: OutcomesNote | None = _kind("map")
    model: str | None = _kind("str")
    run: str | None = _kind("str")
    patches: Any = _kind("any")
    tokens: str | None = _kind("str")  # an attached run's token ids: plain or pseudonym (traces/pseudonym.py)
    window: str | None = _kind("str")  # a flight recorder's dump: which recorded steps (workflows/merge.py)

    def engine_or_reference(self) -> str:
        """The engine that made the trace; traces from before engines were recorded are the reference's."""
        return self.engine or "reference"


@dataclass(frozen=True)
class Outcome(_Json):
    """How the run ended (`specreplay.outcome`): its status (completed, crashed, step_limit,
    partial; a journal's is `running`), the step, and for a crash its kind, message, exception
    type, the source line (`where`) and the side (scheduler or worker) that raised; `unfinished`:
    requests a completed run still held; `engine_output_tokens`: what a live engine reported;
    `engine_output_ids`: the token ids each request's client received, in order (SGLang's
    scheduler: what its output streamer sent)."""

    PART = "outcome"

    status: str | None = _kind("str")
    step: int | None = _kind("int")
    kind: str | None = _kind("str")
    message: str | None = _kind("str")
    exception: str | None = _kind("str")
    where: str | None = _kind("str")
    side: str | None = _kind("str")
    unfinished: tuple[str, ...] | None = _kind("strs")
    request: str | None = _kind("str")  # a crash's request, when the exception names one (engines/crash.py)
    engine_output_tokens: Mapping[str, Any] | None = _kind("map")
    engine_output_ids: Mapping[str, list[int]] | None = _kind("ids")

    @property
    def crashed(self) -> bool:
        return self.status == "crashed"


@dataclass(frozen=True)
class Inputs(_Json):
    """The recorded inputs of a live or attached vLLM run (`specreplay.inputs`): request lives,
    aborts, streamed chunks and engine events, validated by `replay.families.vllm.recorded_inputs`."""

    PART = "inputs"

    requests: Any = _kind("any")
    aborts: Any = _kind("any")
    chunks: Any = _kind("any")
    events: Any = _kind("any")


@dataclass(frozen=True)
class Volatile(_Json):
    """What differs between two runs of the same thing (`specreplay.volatile`): creation time,
    host, Python version. `Trace.content_equals` ignores it."""

    PART = "volatile"

    created_at: str | None = _kind("str")
    host: str | None = _kind("str")
    python: str | None = _kind("str")


def coerce(cls: type[_Part], value: _Part | Mapping[str, Any]) -> _Part:
    """`value` as a `cls`: a plain mapping (a test's hand-written header) is read like a file's."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls.from_dict(value)
    raise TypeError(f"expected {cls.__name__} or a mapping, got {type(value).__name__}")
