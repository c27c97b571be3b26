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
    embeds       input_embeds: the prompt sent as embeddings (SGLang)
    all | none | alternate | random:0.3           this request's acceptance
    accept=2.0.3     its verification rounds accept 2, 0, 3 drafts (then the workload's rule)
    prompt=7.1.4     its own text's token ids (instead of pN)
    prefix=sys       the workload's prefix `sys` first, then its own text (pN: its own text)
    follows=a        the next turn of a: a's prompt and expected outputs, then its own text; it
                     arrives the step after a finished, or @+2 two steps after, or @5 at step 5
    `0-10:p3,t12` is eleven requests "0".."10" with the same fields; a bare `a` takes the defaults.

Settings, a key and its value (joined, `k3`, or apart, `budget 40`):
    budget  max_num_batched_tokens   seqs  max_num_seqs   k          num_spec_tokens
    block   block_size               blocks  num_blocks   len        max_model_len
    threshold  long_prefill_token_threshold   lookahead  num_lookahead_tokens
    vocab   vocab_size               vllm  vllm_version   async | sync
    apc | noapc  enable_prefix_caching           blockdrop | noblockdrop  eagle_block_drop
    adaptive     adaptive_speculation (SGLang's adaptive speculative decoding)
    connector NAME  kv_connector (the KV connector a recorded engine ran with; no engine runs one)
    seed N, steps N (max_steps), name NAME, and an acceptance word for the whole workload;
    prefix NAME=p300 (a shared prefix of 300 seeded tokens) or prefix NAME=7.1.4 (its ids),
    once per prefix.

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
    "connector": "kv_connector",
}
#: Setting word -> (EngineConfig field, value), for the on/off settings.
FLAG_WORDS = {
    "async": ("async_scheduling", True),
    "sync": ("async_scheduling", False),
    "apc": ("enable_prefix_caching", True),
    "noapc": ("enable_prefix_caching", False),
    "blockdrop": ("eagle_block_drop", True),
    "noblockdrop": ("eagle_block_drop", False),
    "adaptive": ("adaptive_speculation", True),
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
_NAMED = re.compile(r"(prompt|prefix|follows|accept)=(.+)")
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


def _numbers(text: str, what: str, where: str) -> list[int]:
    """`7.1.4` -> [7, 1, 4] (token ids, drafts accepted per round)."""
    return [_int(part, what, where) for part in text.split(".")]


def _is_acceptance(word: str) -> bool:
    return word in ACCEPTANCE_KINDS or word.startswith("random:")


def _requests(token: str, where: str) -> list[dict[str, Any]]:
    head, at, arrival = token.partition("@")
    rid, _, body = head.partition(":")
    if not rid:
        raise InputError(f"{where}: {token!r} has no request id (write it as id:p20,t4)")
    item: dict[str, Any] = {}
    if at and arrival.startswith("+"):  # after the request it follows finished
        item["after_finish"] = _int(arrival[1:], f"{token!r}: @+", where)
    elif at:
        item["arrival_step"] = _int(arrival, f"{token!r}: @", where)
    names = {"p": "prompt_len", "t": "max_tokens", "stop": "stop_at", "abort": "abort_step"}
    named = {"prompt": "prompt", "prefix": "prefix", "follows": "follows", "accept": "acceptance"}
    for field in filter(None, body.split(",")):
        match = _FIELD.fullmatch(field)
        value: Any
        if match:
            key, value = names[match[1]], int(match[2])
        elif (pair := _NAMED.fullmatch(field)) is not None:
            key, value = named[pair[1]], pair[2]
            if pair[1] in ("prompt", "accept"):
                value = _numbers(value, f"{token!r}: {pair[1]}=", where)
        elif field == "stream":
            key, value = "streaming", True
        elif field == "embeds":
            key, value = "input_embeds", True
        elif _is_acceptance(field):
            key, value = "acceptance", field
        else:
            raise InputError(
                f"{where}: {token!r}: unknown field {field!r}; use pN, tN, @N, stopN, abortN, stream, embeds, "
                "an acceptance, accept=N.N, prompt=ID.ID, prefix=NAME or follows=ID"
            )
        if key in item or (key == "prompt_len" and "prompt" in item) or (key == "prompt" and "prompt_len" in item):
            raise InputError(f"{where}: {token!r} gives {field!r} twice (or a prompt and pN)")
        item[key] = value
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
        if word in FLAG_WORDS:
            name, value = FLAG_WORDS[word]
            key, target = word, config
        elif word == "prefix":  # prefix NAME=p300 | prefix NAME=7.1.4, once per prefix
            if i == len(words):
                raise InputError(f"{where}: setting 'prefix' needs NAME=pN or NAME=ID.ID")
            _prefix(words[i], data.setdefault("prefixes", {}), where)
            i += 1
            continue
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
                known = ", ".join([*CONFIG_KEYS, *WORKLOAD_KEYS, *FLAG_WORDS, "prefix", "an acceptance"])
                raise InputError(f"{where}: unknown setting {word!r}; known: {known}")
            if not text:  # written apart: `budget 40`
                if i == len(words):
                    raise InputError(f"{where}: setting {key!r} needs a value")
                text, i = words[i], i + 1
            value = text if name in ("vllm_version", "kv_connector", "name") else _int(text, f"setting {key!r}", where)
        if name in target:
            raise InputError(f"{where}: setting {key!r} given twice")
        target[name] = value
    if config:
        data["config"] = config
    return data


def _prefix(text: str, prefixes: dict[str, Any], where: str) -> None:
    name, eq, value = text.partition("=")
    if not name or not eq or not value:
        raise InputError(f"{where}: prefix {text!r} is not NAME=pN or NAME=ID.ID, like system=p300")
    if name in prefixes:
        raise InputError(f"{where}: prefix {name!r} given twice")
    if value.startswith("p"):
        prefixes[name] = _int(value[1:], f"prefix {name!r}: p", where)
    else:
        prefixes[name] = _numbers(value, f"prefix {name!r}", where)


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
    for word, (name, value) in FLAG_WORDS.items():
        if getattr(workload.config, name) == value != getattr(_DEFAULTS.config, name):
            settings.append(word)
    if workload.acceptance != _DEFAULTS.acceptance:
        settings.append(workload.acceptance)
    for key, name in WORKLOAD_KEYS.items():
        value = getattr(workload, name)
        if value != getattr(_DEFAULTS, name):
            if name == "name":
                _spellable(value, "name")
            settings.append(f"{key} {value}")
    for prefix in workload.prefixes:
        _spellable(prefix.name, "prefix name", "=")
        ids = ".".join(map(str, prefix.ids)) if prefix.ids is not None else f"p{prefix.length}"
        settings.append(f"prefix {prefix.name}={ids}")
    parts = [" ".join(requests), " ".join(settings), " ".join(_render_event(e) for e in workload.events)]
    while parts[-1] == "" and len(parts) > 1:
        parts.pop()
    return " | ".join(parts)


def _spellable(text: str, what: str, marks: str = "") -> None:
    marks = " \t\n|:,@()" + marks
    if not text or any(mark in text for mark in marks):
        shown = " ".join(marks.strip())
        raise InputError(f"workload notation cannot spell the {what} {text!r} (a space or one of {shown})")


def _fields(spec: RequestSpec) -> str:
    parts = [f"p{spec.prompt_len}" if spec.prompt is None else "prompt=" + ".".join(map(str, spec.prompt))]
    parts.append(f"t{spec.max_tokens}")
    if spec.stop_at is not None:
        parts.append(f"stop{spec.stop_at}")
    if spec.abort_step is not None:
        parts.append(f"abort{spec.abort_step}")
    if spec.streaming:
        parts.append("stream")
    if spec.input_embeds:
        parts.append("embeds")
    if isinstance(spec.acceptance, tuple):
        parts.append("accept=" + ".".join(map(str, spec.acceptance)))
    elif spec.acceptance is not None:
        parts.append(spec.acceptance)
    if spec.prefix is not None:
        _spellable(spec.prefix, "prefix name", "=")
        parts.append(f"prefix={spec.prefix}")
    if spec.follows is not None:
        _spellable(spec.follows, "request id")
        parts.append(f"follows={spec.follows}")
    if spec.follows is not None and spec.after_finish is not None:  # after the turn before: @+N, +1 unsaid
        arrival = f"@+{spec.after_finish}" if spec.after_finish != 1 else ""
    elif spec.follows is not None:
        arrival = f"@{spec.arrival_step}"  # a fixed step, even 1 (unsaid, a turn follows the finish)
    else:
        arrival = f"@{spec.arrival_step}" if spec.arrival_step != 1 else ""
    return ",".join(parts) + arrival


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
