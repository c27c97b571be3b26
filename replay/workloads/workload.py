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
    [prefixes]               # optional: named shared prefixes of prompts (workloads/prompts.py)
    system = 300             # 300 seeded tokens
    doc = [5, 9, 2]          # or the token ids, each in [0, vocab_size)
    [[requests]]
    id = "0"                 # unique request id
    arrival_step = 1         # engine step before whose schedule() the request is added
    prompt_len = 3           # its own text: seeded tokens (the whole prompt unless prefix/follows)
    prompt = [7, 1, 4]       # optional, instead: its own text's token ids (prompt_len = their count)
    max_tokens = 12
    abort_step = 5           # optional: aborted before the apply of that step
    stop_at = 4              # optional: its expected 4th output token is a stop token id (finish
                             # "stop" at the first output equal to it, as vLLM's stop_token_ids)
    acceptance = "none"      # optional: per-request override; or a list, [2, 0, 3]: its i-th
                             # verification round accepts a_i drafts (0..k), then the workload's rule
    streaming = true         # optional: a streaming-input session (vLLM's resumable request; an
                             # SGLang streaming session), fed by stream_append events; its stream
                             # ends after its last one
    input_embeds = true      # optional: its client sends the prompt as embeddings, not ids
                             # (SGLang's input_embeds: it runs them on placeholder ids 1;
                             # --engine sglang-scheduler only); no prompt, prefix or follows
    prefix = "system"        # optional: its prompt is that prefix, then its own text
    follows = "q0"           # optional: the next turn of a conversation: its prompt is q0's prompt,
                             # q0's expected outputs (max_tokens, or up to its stop), its own text
    after_finish = 1         # with follows, instead of arrival_step: added N steps after the step
                             # in which q0 finished (default 1: the step after, as a client that
                             # sends the next turn when it has the answer)
    [[events]]               # optional control events, applied in list order within a step
    step = 6                 # engine step they land at
    kind = "pause"           # see EVENT_KINDS below
    mode = "keep"            # pause only: keep | wait | abort (vLLM's PauseMode)

`prompt_len` of a request with a prefix or a conversation before it counts its own text only;
`Workload.prompt_len_of(id)` is the whole prompt. A followed request has no abort_step, abort or
resubmit event and is not streaming (its answer is the one whole output); a request arriving
`after_finish` takes no abort_step or event (its arrival step is known only in the run).

Control events, as vLLM 0.32.0's engine receives them between steps (`when = "before"`, the
default: with the input queue, before that step's schedule()), or, for an abort only, after the
step's schedule() and before the oldest batch in flight is applied (`when = "after"`, vLLM's
early aborts queue; the same as a request's `abort_step`):

    pause                 mode = keep (PAUSED_ALL: nothing scheduled) | wait (PAUSED_NEW: running
                          requests go on, no admissions) | abort (abort all, then PAUSED_NEW);
                          clear_cache = true (vLLM's default): once nothing is in flight or
                          schedulable, reset_prefix_cache(reset_running_requests=True)
    resume                back to UNPAUSED
    reset_prefix_cache    reset_running = true preempts every running request first (their
                          in-flight outputs are then dropped); false only resets an idle cache
    abort                 request = "ID": finish_requests([ID], FINISHED_ABORTED)
    resubmit              request = "ID": add the same request (same prompt and max_tokens) again
                          under the same id, a new life of it; the id's previous life must have
                          finished or been aborted by then, or vLLM asserts ("duplicate request id").
                          max_tokens = M: this life's (default: the request's), as a recorded
                          client may ask another
    stream_append         request = "ID" (a streaming request), tokens = N prompt tokens appended,
                          max_tokens = M for the turn they start (default: the request's). vLLM
                          0.32 streams input turn by turn: a chunk that arrives while a turn runs
                          waits for it to end; the next turn's prompt is everything computed so
                          far (the turn's last sampled token is discarded) plus the chunk
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from specreplay.replay.workloads import tokens
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.prompts import Prompts
from specreplay.replay.workloads.request_spec import (
    ACCEPTANCE_KINDS,
    Prefix,
    RequestSpec,
    check_fits,
    check_references,
    parse_acceptance,
    read_int,
    read_prefixes,
    read_request,
    read_table,
)
from specreplay.traces.errors import InputError

EVENT_KINDS = ("pause", "resume", "reset_prefix_cache", "abort", "resubmit", "stream_append")
PAUSE_MODES = ("keep", "wait", "abort")


@dataclass(frozen=True)
class Event:
    """One control event of a workload (see the module docstring)."""

    step: int
    kind: str
    request: str | None = None  # abort, resubmit
    when: str = "before"  # before | after (abort only)
    mode: str = "keep"  # pause
    clear_cache: bool = True  # pause
    reset_running: bool = False  # reset_prefix_cache
    tokens: int = 0  # stream_append: prompt tokens appended
    max_tokens: int | None = None  # stream_append: the next turn's, resubmit: the life's (None: the request's)

    def to_dict(self) -> dict[str, Any]:
        item: dict[str, Any] = {"step": self.step, "kind": self.kind}
        if self.request is not None:
            item["request"] = self.request
        if self.when != "before":
            item["when"] = self.when
        if self.kind == "pause":
            item["mode"] = self.mode
            item["clear_cache"] = self.clear_cache
        if self.kind == "reset_prefix_cache":
            item["reset_running"] = self.reset_running
        if self.kind == "stream_append":
            item["tokens"] = self.tokens
        if self.kind in ("stream_append", "resubmit") and self.max_tokens is not None:
            item["max_tokens"] = self.max_tokens
        return item

    def label(self) -> str:
        """How the trace's step_event column names an engine-level event. A pause is named by its
        mode, as vLLM's scheduler sees it (set_pause_state); its clear_cache shows when it runs,
        as `pause: clear_cache`, so a live or attached recording names it the same way."""
        if self.kind == "pause":
            return f"pause({self.mode})"
        if self.kind == "reset_prefix_cache":
            return "reset_prefix_cache(running)" if self.reset_running else "reset_prefix_cache"
        if self.request is not None:
            return f"{self.kind}({self.request})"
        return self.kind


@dataclass(frozen=True)
class Workload:
    requests: tuple[RequestSpec, ...]
    config: EngineConfig = field(default_factory=EngineConfig)
    name: str = "workload"
    seed: int = 0
    acceptance: str = "all"
    max_steps: int = 10_000
    events: tuple[Event, ...] = ()
    prefixes: tuple[Prefix, ...] = ()

    def acceptance_for(self, spec: RequestSpec) -> tuple[str, float]:
        """The request's acceptance rule (kind, p): its own, else the workload's (also after its
        listed rounds: `draft_rule`)."""
        return parse_acceptance(spec.acceptance if isinstance(spec.acceptance, str) else self.acceptance)

    def draft_rule(self, spec: RequestSpec) -> tokens.DraftRule:
        """The request's drafter rule by position: its listed rounds from its first draft (its
        whole prompt + 1), then its acceptance rule (tokens.listed_rounds)."""
        kind, p = self.acceptance_for(spec)
        if not isinstance(spec.acceptance, tuple):
            return tokens.DraftRule(kind, p)
        first = self.prompt_len_of(spec.request_id) + 1
        return tokens.DraftRule(kind, p, first, tokens.listed_rounds(spec.acceptance))

    @cached_property
    def prompts(self) -> Prompts:
        """Every request's prompt token ids (workloads/prompts.py), resolved once."""
        return Prompts(self)

    def prompt_len_of(self, request_id: str) -> int:
        """The whole prompt of a request: its prefix or the conversation before it, and its own text."""
        return self.prompts.length(request_id)

    def turns(self, spec: RequestSpec) -> list[tuple[int, int]]:
        """A request's turns as (tokens of input, max_tokens): its prompt, then one per
        stream_append event in order. An ordinary request has one."""
        turns = [(self.prompt_len_of(spec.request_id), spec.max_tokens)]
        for event in sorted(self.events, key=lambda e: e.step):  # as the engine applies them
            if event.kind == "stream_append" and event.request == spec.request_id:
                turns.append((event.tokens, event.max_tokens or spec.max_tokens))
        return turns

    def to_dict(self) -> dict[str, Any]:
        requests = []
        for spec in self.requests:
            item: dict[str, Any] = {"id": spec.request_id}
            if spec.after_finish is None:
                item["arrival_step"] = spec.arrival_step
            if spec.prompt is None:
                item["prompt_len"] = spec.prompt_len
            else:
                item["prompt"] = list(spec.prompt)
            item["max_tokens"] = spec.max_tokens
            for key in ("abort_step", "stop_at", "acceptance"):
                if getattr(spec, key) is not None:
                    value = getattr(spec, key)
                    item[key] = list(value) if isinstance(value, tuple) else value
            if spec.streaming:
                item["streaming"] = True
            if spec.input_embeds:
                item["input_embeds"] = True
            for key in ("prefix", "follows", "after_finish"):
                if getattr(spec, key) is not None:
                    item[key] = getattr(spec, key)
            requests.append(item)
        data: dict[str, Any] = {
            "name": self.name,
            "seed": self.seed,
            "acceptance": self.acceptance,
            "max_steps": self.max_steps,
            "config": self.config.to_dict(),
        }
        if self.prefixes:
            data["prefixes"] = {p.name: p.length if p.ids is None else list(p.ids) for p in self.prefixes}
        data["requests"] = requests
        if self.events:
            data["events"] = [event.to_dict() for event in self.events]
        return data

    def at_version(self, vllm_version: str) -> Workload:
        """The same workload run as another modelled vLLM release."""
        config = EngineConfig.from_dict({**self.config.to_dict(), "vllm_version": vllm_version}, "--vllm-version")
        return replace(self, config=config)

    @classmethod
    def from_dict(cls, data: Any, where: str = "workload") -> Workload:
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected a table/object at the top level")
        known = {"name", "seed", "acceptance", "max_steps", "config", "prefixes", "requests", "events"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
        config = EngineConfig.from_dict(read_table(data.get("config", {}), f"{where}: config"), f"{where}: config")
        seed = read_int(data.get("seed", 0), f"{where}: seed", low=0)
        acceptance = data.get("acceptance", "all")
        parse_acceptance(acceptance, f"{where}: acceptance")
        max_steps = read_int(data.get("max_steps", 10_000), f"{where}: max_steps", low=1)
        raw_requests = data.get("requests")
        if not isinstance(raw_requests, list) or not raw_requests:
            raise InputError(f"{where}: needs a non-empty list of [[requests]]")
        prefixes = read_prefixes(data.get("prefixes", {}), f"{where}: prefixes", config)
        requests = []
        seen: dict[str, RequestSpec] = {}  # the requests listed so far, by id
        for i, raw in enumerate(raw_requests):
            requests.append(read_request(raw, f"{where}: requests[{i}]", config))
            if requests[-1].request_id in seen:
                raise InputError(f"{where}: requests[{i}]: duplicate id {requests[-1].request_id!r}")
            check_references(requests[-1], seen, prefixes, f"{where}: requests[{i}]")
            seen[requests[-1].request_id] = requests[-1]
        name = data.get("name", "workload")
        if not isinstance(name, str):
            raise InputError(f"{where}: name must be a string")
        # The whole prompts (a prefix or a conversation before a request's own text) must fit.
        lengths = Prompts(cls(tuple(requests), config, seed=seed, prefixes=prefixes))
        for i, spec in enumerate(requests):
            check_fits(lengths.length(spec.request_id), spec.max_tokens, config, f"{where}: requests[{i}]", spec)
        raw_events = data.get("events", [])
        if not isinstance(raw_events, list):
            raise InputError(f"{where}: events must be a list of [[events]] tables")
        specs = {spec.request_id: spec for spec in requests}
        followers: dict[str, str] = {}  # a followed request -> the first turn that follows it
        for spec in requests:
            if spec.follows is not None:
                followers.setdefault(spec.follows, spec.request_id)
        events = tuple(
            _event(raw, f"{where}: events[{i}]", specs, config, lengths, followers) for i, raw in enumerate(raw_events)
        )
        check_events(events, f"{where}: events")
        workload = cls(
            requests=tuple(requests),
            config=config,
            name=name,
            seed=seed,
            acceptance=acceptance,
            max_steps=max_steps,
            events=events,
            prefixes=prefixes,
        )
        for i, spec in enumerate(requests):
            if spec.streaming:
                _check_session(workload, spec, f"{where}: requests[{i}]")
        return workload


def check_events(events: tuple[Event, ...], where: str) -> None:
    """Rules across events: every pause is followed by a resume (a run paused for good never
    finishes its requests)."""
    paused_at = None
    for event in sorted(events, key=lambda e: e.step):
        if event.kind == "pause" and paused_at is None:
            paused_at = event.step
        elif event.kind == "resume":
            paused_at = None
    if paused_at is not None:
        raise InputError(f"{where}: the pause at step {paused_at} has no later resume; its requests would never finish")


def _check_session(workload: Workload, spec: RequestSpec, where: str) -> None:
    """A streaming session's whole sequence (each turn keeps all but its last output) must fit."""
    config = workload.config
    turns = workload.turns(spec)
    total = sum(tokens + max_tokens - 1 for tokens, max_tokens in turns) + 1
    if total > config.max_model_len:
        raise InputError(
            f"{where}: the streaming session's turns need {total} tokens, above max_model_len {config.max_model_len}"
        )
    blocks_needed = -(
        -min(total + config.num_spec_tokens + config.num_lookahead_tokens, config.max_model_len) // config.block_size
    )
    if blocks_needed > config.num_blocks - 1:
        raise InputError(
            f"{where}: the streaming session needs {blocks_needed} KV blocks alone, the cache has "
            f"{config.num_blocks - 1} usable"
        )


def _event(
    raw: Any,
    where: str,
    specs: dict[str, RequestSpec],
    config: EngineConfig,
    prompts: Prompts,
    followers: dict[str, str],
) -> Event:
    raw = read_table(raw, where)
    kind = raw.get("kind")
    if kind not in EVENT_KINDS:
        raise InputError(f"{where}: kind must be one of {', '.join(EVENT_KINDS)}, got {kind!r}")
    allowed = {"step", "kind", "when"} | {
        "pause": {"mode", "clear_cache"},
        "resume": set(),
        "reset_prefix_cache": {"reset_running"},
        "abort": {"request"},
        "resubmit": {"request", "max_tokens"},
        "stream_append": {"request", "tokens", "max_tokens"},
    }[kind]
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise InputError(f"{where}: {kind} takes no {unknown[0]!r}; it takes {', '.join(sorted(allowed))}")
    if "step" not in raw:
        raise InputError(f"{where}: missing 'step'")
    step = read_int(raw["step"], f"{where}: step", low=1)
    when = raw.get("when", "before")
    if when not in ("before", "after"):
        raise InputError(f"{where}: when must be 'before' or 'after', got {when!r}")
    if when == "after" and kind != "abort":
        raise InputError(
            f"{where}: only an abort can land after a step's schedule() in vLLM 0.32 "
            "(its early aborts queue); use when = 'before'"
        )
    request = None
    if kind in ("abort", "resubmit", "stream_append"):
        request = raw.get("request")
        if isinstance(request, int) and not isinstance(request, bool):
            request = str(request)
        if not isinstance(request, str) or request not in specs:
            raise InputError(f"{where}: request must name a request of the workload, got {request!r}")
        if specs[request].after_finish is not None:
            raise InputError(
                f"{where}: request {request!r} arrives after_finish (its step is known only in the run); "
                "give it an arrival_step to send it events"
            )
        if kind in ("abort", "resubmit") and request in followers:
            raise InputError(
                f"{where}: request {request!r} is followed by {followers[request]!r}, whose prompt holds its whole "
                f"answer; {'aborting' if kind == 'abort' else 'resubmitting'} it is not supported"
            )
        arrival = specs[request].arrival_step
        if step < arrival:
            raise InputError(f"{where}: step {step} is before request {request!r} arrives (arrival_step {arrival})")
        if kind == "resubmit" and step == arrival:
            raise InputError(
                f"{where}: a resubmit of {request!r} must come after its arrival step {arrival} (its first life "
                "has not finished yet)"
            )
    tokens, max_tokens = 0, None
    if kind == "stream_append":
        if not specs[request].streaming:
            raise InputError(f"{where}: request {request!r} is not a streaming request (set streaming = true)")
        if "tokens" not in raw:
            raise InputError(f"{where}: missing 'tokens' (prompt tokens appended)")
        tokens = read_int(raw["tokens"], f"{where}: tokens", low=1)
    if raw.get("max_tokens") is not None:
        max_tokens = read_int(raw["max_tokens"], f"{where}: max_tokens", low=1)
        if kind == "resubmit":  # the life must fit as the request's first had to
            check_fits(prompts.length(request), max_tokens, config, where, specs[request])
    if kind == "resubmit" and specs[request].streaming:
        raise InputError(
            f"{where}: resubmitting streaming request {request!r} is not supported (the same id "
            "is the session's next chunk to vLLM)"
        )
    mode = raw.get("mode", "keep")
    if mode not in PAUSE_MODES:
        raise InputError(f"{where}: mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
    flags = {}
    for key, default in (("clear_cache", True), ("reset_running", False)):
        flags[key] = raw.get(key, default)
        if not isinstance(flags[key], bool):
            raise InputError(f"{where}: {key} must be true or false, got {flags[key]!r}")
    return Event(
        step=step, kind=kind, request=request, when=when, mode=mode, tokens=tokens, max_tokens=max_tokens, **flags
    )


def load_workload(path: str | Path, default_version: str | None = None) -> Workload:
    """Load a TOML (.toml) or JSON (anything else) workload file; InputError on any problem.
    `default_version`: the vLLM release to model when the file's config names none."""
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
    if default_version is not None and isinstance(data, dict) and isinstance(data.get("config", {}), dict):
        if "vllm_version" not in data.get("config", {}):
            data = {**data, "config": {**data.get("config", {}), "vllm_version": default_version}}
    return Workload.from_dict(data, str(path))


__all__ = [
    "ACCEPTANCE_KINDS",
    "EVENT_KINDS",
    "Event",
    "Prefix",
    "RequestSpec",
    "Workload",
    "load_workload",
    "parse_acceptance",
]
