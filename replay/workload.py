"""Workloads: the requests, their timing, the acceptance rule and the engine config of a run.

Where it sits: the input of record (replay); stored whole in every trace's metadata (traces), so
`replay` and `gate` can run the same workload through another implementation.

File format (TOML or JSON, same keys)::

    name = "mine"            # optional
    seed = 7                 # seeds prompts, the target model and random acceptance
    acceptance = "all"       # all | none | alternate | random:P  (P in [0, 1])
    max_steps = 2000         # stop the run after this many engine steps
    [config]                 # any EngineConfig field, see replay/config.py
    max_num_batched_tokens = 40
    [[requests]]
    id = "0"                 # unique request id
    arrival_step = 1         # engine step before whose schedule() the request is added
    prompt_len = 3
    max_tokens = 12
    abort_step = 5           # optional: aborted before the apply of that step
    stop_at = 4              # optional: its expected 4th output token is a stop token id (finish
                             # "stop" at the first output equal to it, as vLLM's stop_token_ids)
    acceptance = "none"      # optional: per-request override
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreplay.replay.config import EngineConfig
from specreplay.traces.errors import InputError

ACCEPTANCE_KINDS = ("all", "none", "alternate", "random")


def parse_acceptance(text: str, where: str = "acceptance") -> tuple[str, float]:
    """'all' | 'none' | 'alternate' | 'random:P' -> (kind, p)."""
    if not isinstance(text, str):
        raise InputError(f"{where}: expected a string like 'all' or 'random:0.7', got {text!r}")
    kind, _, arg = text.partition(":")
    if kind not in ACCEPTANCE_KINDS:
        raise InputError(f"{where}: unknown acceptance {text!r}; use all, none, alternate or random:P")
    if kind == "random":
        try:
            p = float(arg)
        except ValueError:
            raise InputError(f"{where}: random acceptance needs a probability, like random:0.7") from None
        if not 0.0 <= p <= 1.0:
            raise InputError(f"{where}: acceptance probability {p} is outside [0, 1]")
        return kind, p
    if arg:
        raise InputError(f"{where}: acceptance {kind!r} takes no argument")
    return kind, 1.0 if kind == "all" else 0.0


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    arrival_step: int = 1
    prompt_len: int = 8
    max_tokens: int = 16
    abort_step: int | None = None
    stop_at: int | None = None
    acceptance: str | None = None


@dataclass(frozen=True)
class Workload:
    requests: tuple[RequestSpec, ...]
    config: EngineConfig = field(default_factory=EngineConfig)
    name: str = "workload"
    seed: int = 0
    acceptance: str = "all"
    max_steps: int = 10_000

    def acceptance_for(self, spec: RequestSpec) -> tuple[str, float]:
        return parse_acceptance(spec.acceptance or self.acceptance)

    def to_dict(self) -> dict[str, Any]:
        requests = []
        for spec in self.requests:
            item = {"id": spec.request_id, "arrival_step": spec.arrival_step,
                    "prompt_len": spec.prompt_len, "max_tokens": spec.max_tokens}
            for key in ("abort_step", "stop_at", "acceptance"):
                if getattr(spec, key) is not None:
                    item[key] = getattr(spec, key)
            requests.append(item)
        return {"name": self.name, "seed": self.seed, "acceptance": self.acceptance,
                "max_steps": self.max_steps, "config": self.config.to_dict(), "requests": requests}

    @classmethod
    def from_dict(cls, data: Any, where: str = "workload") -> "Workload":
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected a table/object at the top level")
        known = {"name", "seed", "acceptance", "max_steps", "config", "requests"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
        config = EngineConfig.from_dict(_table(data.get("config", {}), f"{where}: config"), f"{where}: config")
        seed = _int(data.get("seed", 0), f"{where}: seed", low=0)
        acceptance = data.get("acceptance", "all")
        parse_acceptance(acceptance, f"{where}: acceptance")
        max_steps = _int(data.get("max_steps", 10_000), f"{where}: max_steps", low=1)
        raw_requests = data.get("requests")
        if not isinstance(raw_requests, list) or not raw_requests:
            raise InputError(f"{where}: needs a non-empty list of [[requests]]")
        requests = []
        seen: set[str] = set()
        for i, raw in enumerate(raw_requests):
            requests.append(_request(raw, f"{where}: requests[{i}]", config))
            if requests[-1].request_id in seen:
                raise InputError(f"{where}: requests[{i}]: duplicate id {requests[-1].request_id!r}")
            seen.add(requests[-1].request_id)
        name = data.get("name", "workload")
        if not isinstance(name, str):
            raise InputError(f"{where}: name must be a string")
        return cls(requests=tuple(requests), config=config, name=name, seed=seed,
                   acceptance=acceptance, max_steps=max_steps)


def load_workload(path: str | Path) -> Workload:
    """Load a TOML (.toml) or JSON (anything else) workload file; InputError on any problem."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read workload file ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: workload file is not UTF-8 text") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise InputError(f"{path}: not valid {kind} ({' '.join(str(exc).split())[:120]})") from None
    return Workload.from_dict(data, str(path))


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected a table/object")
    return value


def _int(value: Any, where: str, low: int | None = None, high: int = 1 << 30) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: expected an integer, got {value!r}")
    if low is not None and value < low:
        raise InputError(f"{where}: must be >= {low}, got {value}")
    if value > high:
        raise InputError(f"{where}: {value} is unreasonably large (limit {high})")
    return value


def _request(raw: Any, where: str, config: EngineConfig) -> RequestSpec:
    raw = _table(raw, where)
    known = {"id", "arrival_step", "prompt_len", "max_tokens", "abort_step", "stop_at", "acceptance"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    if "id" not in raw:
        raise InputError(f"{where}: missing 'id'")
    rid = raw["id"]
    if isinstance(rid, int) and not isinstance(rid, bool):
        rid = str(rid)
    if not isinstance(rid, str) or not rid or len(rid) > 200:
        raise InputError(f"{where}: id must be a non-empty string")
    spec = RequestSpec(
        request_id=rid,
        arrival_step=_int(raw.get("arrival_step", 1), f"{where}: arrival_step", low=1),
        prompt_len=_int(raw.get("prompt_len", 8), f"{where}: prompt_len", low=1),
        max_tokens=_int(raw.get("max_tokens", 16), f"{where}: max_tokens", low=1),
        abort_step=None if raw.get("abort_step") is None else _int(raw["abort_step"], f"{where}: abort_step", low=1),
        stop_at=None if raw.get("stop_at") is None else _int(raw["stop_at"], f"{where}: stop_at", low=1),
        acceptance=raw.get("acceptance"),
    )
    if spec.acceptance is not None:
        parse_acceptance(spec.acceptance, f"{where}: acceptance")
    if spec.prompt_len + spec.max_tokens > config.max_model_len:
        raise InputError(f"{where}: prompt_len + max_tokens = {spec.prompt_len + spec.max_tokens} "
                         f"exceeds max_model_len {config.max_model_len}")
    # Block 0 is vLLM's null block; a request must fit alone (drafts and lookahead included) or
    # it can never be admitted, or preempts itself forever.
    longest = min(spec.prompt_len + spec.max_tokens + config.num_spec_tokens + config.num_lookahead_tokens,
                  config.max_model_len)
    blocks_needed = -(-longest // config.block_size)
    if blocks_needed > config.num_blocks - 1:
        raise InputError(f"{where}: needs {blocks_needed} KV blocks alone, the cache has {config.num_blocks - 1} "
                         f"usable (num_blocks {config.num_blocks}, block 0 reserved)")
    return spec


__all__ = ["RequestSpec", "Workload", "load_workload", "parse_acceptance"]
