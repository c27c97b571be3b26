"""A workload in one line, for tests and quick experiments: `workload_from_notation(text)`.

Where it sits: in workloads, beside the workload file format it is a shorthand for; it builds the
file format's dict and hands it to `Workload.from_dict`, so a line is checked exactly as a file
is, and bad text is one InputError line.

    "a:p20,t4 b:p8,t4@3 | budget 40 k3 async | pause@6:wait resume@9"

Up to three parts, split by `|`: the requests, then the engine and workload settings, then the
control events (either of the last two may be empty or left out).

Requests, one token each, `ID:FIELD,FIELD,...[@ARRIVAL]`:
    p20          prompt_len 20 (default 8)        t4          max_tokens 4 (default 16)
    @3           arrives at step 3 (default 1)    stop2       stop_at 2
    abort5       abort_step 5                     stream      a streaming-input session
    all | none | alternate | random:0.3           this request's acceptance
    `0-10:p3,t12` is eleven requests "0".."10" with the same fields; a bare `a` takes the defaults.

Settings, a key and its value (joined, `k3`, or apart, `budget 40`):
    budget  max_num_batched_tokens   seqs  max_num_seqs   k          num_spec_tokens
    block   block_size               blocks  num_blocks   len        max_model_len
    threshold  long_prefill_token_threshold   lookahead  num_lookahead_tokens
    vocab   vocab_size               vllm  vllm_version   async | sync
    seed N, steps N (max_steps), name NAME, and an acceptance word for the whole workload.

Events, `KIND[(REQUEST)]@STEP[:OPTION,...]`:
    pause@6[:keep|wait|abort][,noclear]      resume@9        reset@4[:running]
    abort(a)@5[:after]     resubmit(a)@7[:t5]     append(s)@5:p6[,t4]   (stream_append: p the
    tokens appended, t the turn's max_tokens)

`notation_of(workload)` writes a workload back in this form (only what differs from the
defaults), so that `workload_from_notation(notation_of(w)) == w`.
"""

from __future__ import annotations

import re
from typing import Any

from specreplay.replay.workloads.workload import ACCEPTANCE_KINDS, Event, RequestSpec, Workload
from specreplay.traces.errors import InputError

#: Setting key -> EngineConfig field, in the order notation_of writes them.
CONFIG_KEYS = {
    "budget": "max_num_batched_tokens",
    "seqs": "max_num_seqs",
    "k": "num_spec_tokens",
    "block": "block_size",
    "blocks": "num_blocks",
    "len": "max_model_len",
    "threshold": "long_prefill_token_threshold",
    "lookahead": "num_lookahead_tokens",
    "vocab": "vocab_size",
    "vllm": "vllm_version",
}
#: Setting key -> Workload field.
WORKLOAD_KEYS = {"seed": "seed", "steps": "max_steps", "name": "name"}
#: Event kind in the notation -> the workload file's kind.
EVENT_NAMES = {
    "pause": "pause",
    "resume": "resume",
    "reset": "reset_prefix_cache",
    "abort": "abort",
    "resubmit": "resubmit",
    "append": "stream_append",
}
_KIND_NAMES = {kind: name for name, kind in EVENT_NAMES.items()}
_FIELD = re.compile(r"(p|t|stop|abort)(\d+)")
_SETTING = re.compile(r"([a-z]+)(.*)")
_EVENT = re.compile(r"([a-z_]+)(?:\(([^()@:,\s]+)\))?@(\d+)(?::(.*))?")
_RANGE = re.compile(r"(\d+)-(\d+)")
_DEFAULTS = Workload(requests=(RequestSpec("default"),))


def workload_from_notation(text: str) -> Workload:
    """The workload a notation line describes (module docstring); InputError on bad text."""
    if not isinstance(text, str):
        raise InputError(f"workload notation: expected a string, got {text!r}")
    where = f"workload notation {' '.join(text.split())!r}"
    parts = text.split("|")
    if len(parts) > 3:
        raise InputError(f"{where}: at most three parts (requests | settings | events), got {len(parts)}")
    parts += [""] * (3 - len(parts))
    data = _settings(parts[1].split(), where)
    data["requests"] = [spec for token in parts[0].split() for spec in _requests(token, where)]
    if not data["requests"]:
        raise InputError(f"{where}: names no request (write one like a:p20,t4)")
    events = [_event(token, where) for token in parts[2].split()]
    if events:
        data["events"] = events
    return Workload.from_dict(data, where)


def _int(value: str, what: str, where: str) -> int:
    if not value.isdigit():
        raise InputError(f"{where}: {what} takes a whole number, got {value!r}")
    return int(value)


def _is_acceptance(word: str) -> bool:
    return word in ACCEPTANCE_KINDS or word.startswith("random:")


def _requests(token: str, where: str) -> list[dict[str, Any]]:
    head, at, arrival = token.partition("@")
    rid, _, body = head.partition(":")
    if not rid:
        raise InputError(f"{where}: {token!r} has no request id (write it as id:p20,t4)")
    item: dict[str, Any] = {}
    if at:
        item["arrival_step"] = _int(arrival, f"{token!r}: @", where)
    names = {"p": "prompt_len", "t": "max_tokens", "stop": "stop_at", "abort": "abort_step"}
    for field in filter(None, body.split(",")):
        match = _FIELD.fullmatch(field)
        if match:
            key = names[match[1]]
        elif field == "stream":
            key = "streaming"
        elif _is_acceptance(field):
            key = "acceptance"
        else:
            raise InputError(
                f"{where}: {token!r}: unknown field {field!r}; use pN, tN, @N, stopN, abortN, stream or an acceptance"
            )
        if key in item:
            raise InputError(f"{where}: {token!r} gives {field!r} twice")
        item[key] = int(match[2]) if match else (True if key == "streaming" else field)
    span = _RANGE.fullmatch(rid)
    if span is None:
        return [{"id": rid, **item}]
    low, high = int(span[1]), int(span[2])
    if high < low:
        raise InputError(f"{where}: {token!r}: the id range {rid!r} runs backwards")
    return [{"id": str(i), **item} for i in range(low, high + 1)]


def _settings(words: list[str], where: str) -> dict[str, Any]:
    data: dict[str, Any] = {}
    config: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        value: bool | int | str
        if word in ("async", "sync"):
            key, target, name, value = word, config, "async_scheduling", word == "async"
        elif _is_acceptance(word):
            key, target, name, value = "acceptance", data, "acceptance", word
        else:
            match = _SETTING.fullmatch(word)
            key, text = (match[1], match[2]) if match else (word, "")
            if key in CONFIG_KEYS:
                target, name = config, CONFIG_KEYS[key]
            elif key in WORKLOAD_KEYS:
                target, name = data, WORKLOAD_KEYS[key]
            else:
                known = ", ".join([*CONFIG_KEYS, *WORKLOAD_KEYS, "async", "sync", "an acceptance"])
                raise InputError(f"{where}: unknown setting {word!r}; known: {known}")
            if not text:  # written apart: `budget 40`
                if i == len(words):
                    raise InputError(f"{where}: setting {key!r} needs a value")
                text, i = words[i], i + 1
            value = text if name in ("vllm_version", "name") else _int(text, f"setting {key!r}", where)
        if name in target:
            raise InputError(f"{where}: setting {key!r} given twice")
        target[name] = value
    if config:
        data["config"] = config
    return data


def _event(token: str, where: str) -> dict[str, Any]:
    match = _EVENT.fullmatch(token)
    if match is None:
        raise InputError(f"{where}: event {token!r} is not KIND[(REQUEST)]@STEP[:OPTIONS], like pause@6 or abort(a)@5")
    name, request, step, options = match[1], match[2], int(match[3]), match[4]
    if name not in EVENT_NAMES:
        raise InputError(f"{where}: event {token!r}: unknown kind {name!r}; known: {', '.join(EVENT_NAMES)}")
    item: dict[str, Any] = {"step": step, "kind": EVENT_NAMES[name]}
    if request is not None:
        item["request"] = request
    for option in filter(None, (options or "").split(",")):
        count = _FIELD.fullmatch(option)
        if name == "pause" and option in ("keep", "wait", "abort"):
            key, value = "mode", option
        elif name == "pause" and option == "noclear":
            key, value = "clear_cache", False
        elif name == "reset" and option == "running":
            key, value = "reset_running", True
        elif name == "abort" and option == "after":
            key, value = "when", "after"
        elif name in ("resubmit", "append") and count and count[1] == "t":
            key, value = "max_tokens", int(count[2])
        elif name == "append" and count and count[1] == "p":
            key, value = "tokens", int(count[2])
        else:
            raise InputError(f"{where}: event {token!r}: {name} takes no option {option!r}")
        if key in item:
            raise InputError(f"{where}: event {token!r} gives {option!r} twice")
        item[key] = value
    return item


def notation_of(workload: Workload) -> str:
    """The workload as one notation line, writing only what differs from the defaults; InputError
    for a workload the notation cannot spell (an id or name with spaces or the notation's marks)."""
    requests = _render_requests(workload.requests)
    settings = []
    for key, name in CONFIG_KEYS.items():
        value = getattr(workload.config, name)
        if value != getattr(_DEFAULTS.config, name):
            settings.append(f"k{value}" if key == "k" else f"{key} {value}")
    if workload.config.async_scheduling != _DEFAULTS.config.async_scheduling:
        settings.append("async" if workload.config.async_scheduling else "sync")
    if workload.acceptance != _DEFAULTS.acceptance:
        settings.append(workload.acceptance)
    for key, name in WORKLOAD_KEYS.items():
        value = getattr(workload, name)
        if value != getattr(_DEFAULTS, name):
            if name == "name":
                _spellable(value, "name")
            settings.append(f"{key} {value}")
    parts = [" ".join(requests), " ".join(settings), " ".join(_render_event(e) for e in workload.events)]
    while parts[-1] == "" and len(parts) > 1:
        parts.pop()
    return " | ".join(parts)


def _spellable(text: str, what: str) -> None:
    if not text or any(mark in text for mark in " \t\n|:,@()"):
        raise InputError(f"workload notation cannot spell the {what} {text!r} (a space or one of | : , @ ( ))")


def _fields(spec: RequestSpec) -> str:
    parts = [f"p{spec.prompt_len}", f"t{spec.max_tokens}"]
    if spec.stop_at is not None:
        parts.append(f"stop{spec.stop_at}")
    if spec.abort_step is not None:
        parts.append(f"abort{spec.abort_step}")
    if spec.streaming:
        parts.append("stream")
    if spec.acceptance is not None:
        parts.append(spec.acceptance)
    return ",".join(parts) + (f"@{spec.arrival_step}" if spec.arrival_step != 1 else "")


def _render_requests(specs: tuple[RequestSpec, ...]) -> list[str]:
    """One token a request; a run of three or more with ids n, n+1, ... and the same fields is
    written as one range."""
    tokens: list[str] = []
    i = 0
    while i < len(specs):
        _spellable(specs[i].request_id, "request id")
        body = _fields(specs[i])
        j = i + 1
        if specs[i].request_id == str(_number(specs[i].request_id)):
            first = _number(specs[i].request_id)
            while j < len(specs) and specs[j].request_id == str(first + j - i) and _fields(specs[j]) == body:
                j += 1
        if j - i >= 3:
            tokens.append(f"{specs[i].request_id}-{specs[j - 1].request_id}:{body}")
        else:
            j = i + 1
            tokens.append(f"{specs[i].request_id}:{body}")
        i = j
    return tokens


def _number(text: str) -> int:
    return int(text) if text.isdigit() else -1


def _render_event(event: Event) -> str:
    name = _KIND_NAMES[event.kind]
    head = f"{name}({event.request})" if event.request is not None else name
    options = []
    if event.kind == "pause":
        if event.mode != "keep":
            options.append(event.mode)
        if not event.clear_cache:
            options.append("noclear")
    if event.kind == "reset_prefix_cache" and event.reset_running:
        options.append("running")
    if event.when == "after":
        options.append("after")
    if event.kind == "stream_append":
        options.append(f"p{event.tokens}")
    if event.kind in ("stream_append", "resubmit") and event.max_tokens is not None:
        options.append(f"t{event.max_tokens}")
    return f"{head}@{event.step}" + (f":{','.join(options)}" if options else "")


__all__ = ["notation_of", "workload_from_notation"]
