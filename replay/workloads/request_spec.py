"""One request of a workload: its fields, as a workload file gives them, and their checks.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. `Workload.from_dict` (workloads/workload.py, where the file format is
written out) reads each `[[requests]]` table and the `[prefixes]` table here; what a request's
prompt then holds is resolved in workloads/prompts.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specreplay.replay.workloads.config import EngineConfig
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
    arrival_step: int = 1  # unused with after_finish (then 1)
    prompt_len: int = 8  # its own text's tokens: len(prompt) when given
    max_tokens: int = 16
    abort_step: int | None = None
    stop_at: int | None = None
    acceptance: str | tuple[int, ...] | None = None  # a rule, or the drafts accepted per verification round
    streaming: bool = False
    prompt: tuple[int, ...] | None = None  # its own text's token ids; None: prompt_len seeded ones
    prefix: str | None = None  # a Prefix of the workload, before its own text
    follows: str | None = None  # a request: its prompt and expected outputs, before its own text
    after_finish: int | None = None  # with follows: added this many steps after that request finished
    input_embeds: bool = False  # its client sends the prompt as embeddings (SGLang's input_embeds), not ids

    def __post_init__(self) -> None:
        if self.prompt is not None:  # one length, whoever built it
            object.__setattr__(self, "prompt_len", len(self.prompt))
        if self.after_finish is not None:  # no step of its own: one value, so equal specs compare equal
            object.__setattr__(self, "arrival_step", 1)


@dataclass(frozen=True)
class Prefix:
    """A named prefix that requests' prompts share: `ids` as given, else `length` seeded tokens."""

    name: str
    length: int = 0
    ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.ids is not None:
            object.__setattr__(self, "length", len(self.ids))


def read_table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected a table/object")
    return value


def read_int(value: Any, where: str, low: int | None = None, high: int = 1 << 30) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: expected an integer, got {value!r}")
    if low is not None and value < low:
        raise InputError(f"{where}: must be >= {low}, got {value}")
    if value > high:
        raise InputError(f"{where}: {value} is unreasonably large (limit {high})")
    return value


def read_request(raw: Any, where: str, config: EngineConfig) -> RequestSpec:
    raw = read_table(raw, where)
    known = {
        "id",
        "arrival_step",
        "prompt_len",
        "max_tokens",
        "abort_step",
        "stop_at",
        "acceptance",
        "streaming",
        "prompt",
        "prefix",
        "follows",
        "after_finish",
        "input_embeds",
    }
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
    prompt = None if raw.get("prompt") is None else _ids(raw["prompt"], f"{where}: prompt", config)
    if prompt is not None and raw.get("prompt_len") is not None:
        prompt_len = read_int(raw["prompt_len"], f"{where}: prompt_len", low=1)
        if prompt_len != len(prompt):
            raise InputError(
                f"{where}: prompt_len {prompt_len} is not the {len(prompt)} ids of prompt; give one of the two"
            )
    follows = _name(raw.get("follows"), f"{where}: follows")
    after_finish = None
    if raw.get("after_finish") is not None:
        if follows is None:
            raise InputError(f"{where}: after_finish needs follows (the request whose finish it waits for)")
        if raw.get("arrival_step") is not None:
            raise InputError(f"{where}: give arrival_step or after_finish, not both")
        after_finish = read_int(raw["after_finish"], f"{where}: after_finish", low=1)
    elif follows is not None and raw.get("arrival_step") is None:
        after_finish = 1  # a client sends the next turn once it has the answer
    spec = RequestSpec(
        request_id=rid,
        arrival_step=read_int(raw.get("arrival_step", 1), f"{where}: arrival_step", low=1),
        prompt_len=read_int(raw.get("prompt_len", 8), f"{where}: prompt_len", low=1) if prompt is None else len(prompt),
        max_tokens=read_int(raw.get("max_tokens", 16), f"{where}: max_tokens", low=1),
        abort_step=None
        if raw.get("abort_step") is None
        else read_int(raw["abort_step"], f"{where}: abort_step", low=1),
        stop_at=None if raw.get("stop_at") is None else read_int(raw["stop_at"], f"{where}: stop_at", low=1),
        acceptance=_request_acceptance(raw.get("acceptance"), f"{where}: acceptance", config),
        streaming=raw.get("streaming", False),
        prompt=prompt,
        prefix=_name(raw.get("prefix"), f"{where}: prefix"),
        follows=follows,
        after_finish=after_finish,
        input_embeds=raw.get("input_embeds", False),
    )
    if not isinstance(spec.streaming, bool):
        raise InputError(f"{where}: streaming must be true or false")
    if not isinstance(spec.input_embeds, bool):
        raise InputError(f"{where}: input_embeds must be true or false")
    if spec.input_embeds:
        # SGLang runs such a request on placeholder ids (1 per embedding row: Prompts._own), so
        # there are no ids of its own to give, to share with a prefix or to carry into a turn.
        given = next((key for key in ("prompt", "prefix", "follows", "streaming") if raw.get(key)), None)
        if given is not None:
            raise InputError(
                f"{where}: an input_embeds request sends embeddings, not ids: it takes prompt_len, not {given}"
            )
    if spec.streaming and spec.stop_at is not None:
        raise InputError(f"{where}: a streaming request takes no stop_at (its turns end at max_tokens)")
    if spec.streaming and isinstance(spec.acceptance, tuple):
        raise InputError(
            f"{where}: a streaming request takes an acceptance rule, not a list (its later turns' rounds "
            "start where the turn before left off)"
        )
    if after_finish is not None and (spec.streaming or spec.abort_step is not None):
        what = "is not streaming" if spec.streaming else "takes no abort_step"
        raise InputError(
            f"{where}: a request arriving after_finish {what} (its arrival step is known only in the run); "
            "give it an arrival_step"
        )
    return spec


def _request_acceptance(value: Any, where: str, config: EngineConfig) -> str | tuple[int, ...] | None:
    """A request's acceptance: a rule, or the drafts accepted in each verification round (0..k)."""
    if value is None:
        return None
    if isinstance(value, str):
        parse_acceptance(value, where)
        return value
    if not isinstance(value, list) or not value:
        raise InputError(
            f"{where}: expected a rule like 'all' or 'random:0.7', or the drafts accepted per verification round "
            f"like [2, 0, 3], got {str(value)[:60]!r}"
        )
    k = config.num_spec_tokens
    rounds = tuple(read_int(a, f"{where}[{i}]", low=0) for i, a in enumerate(value))
    for i, accepted in enumerate(rounds):
        if accepted > k:
            raise InputError(f"{where}[{i}]: {accepted} drafts accepted in a round of at most num_spec_tokens = {k}")
    return rounds


def _ids(value: Any, where: str, config: EngineConfig) -> tuple[int, ...]:
    """Token ids: a non-empty list of integers in [0, vocab_size)."""
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: expected a non-empty list of token ids, got {str(value)[:60]!r}")
    ids = tuple(read_int(t, f"{where}[{i}]", low=0) for i, t in enumerate(value))
    for i, token in enumerate(ids):
        if token >= config.vocab_size:
            raise InputError(f"{where}[{i}]: token id {token} is outside the vocabulary [0, {config.vocab_size})")
    return ids


def _name(value: Any, where: str) -> str | None:
    """A reference to a prefix or a request, by name (an integer id as its text)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    # Printable: a name is shown in one-line messages and tables.
    if not isinstance(value, str) or not value or len(value) > 200 or not value.isprintable():
        raise InputError(f"{where}: expected a name, got {value!r}")
    return value


def read_prefixes(raw: Any, where: str, config: EngineConfig) -> tuple[Prefix, ...]:
    """The [prefixes] table: NAME = a count of seeded tokens, or NAME = [ids]."""
    table = read_table(raw, where)
    out = []
    for name, value in table.items():
        _name(name, where)
        if isinstance(value, list):
            out.append(Prefix(name, ids=_ids(value, f"{where}: {name}", config)))
        else:
            out.append(Prefix(name, read_int(value, f"{where}: {name}", low=1)))
    return tuple(out)


def check_references(
    spec: RequestSpec, before: dict[str, RequestSpec], prefixes: tuple[Prefix, ...], where: str
) -> None:
    """A prefix the request names exists; a request it follows is listed before it (so a
    conversation has no cycle), and has one whole answer to give."""
    if spec.prefix is not None and all(p.name != spec.prefix for p in prefixes):
        known = ", ".join(p.name for p in prefixes) or "none"
        raise InputError(f"{where}: prefix {spec.prefix!r} is not in the workload's [prefixes] (known: {known})")
    if spec.follows is None:
        return
    if spec.prefix is not None:
        raise InputError(f"{where}: give prefix or follows, not both (a follow-up starts with its conversation)")
    followed = before.get(spec.follows)
    if followed is None:
        raise InputError(
            f"{where}: follows {spec.follows!r}, which is not a request listed before it (list the turns in order)"
        )
    if followed.streaming or followed.abort_step is not None:
        what = "a streaming session" if followed.streaming else "aborted (abort_step)"
        raise InputError(
            f"{where}: follows {spec.follows!r}, which is {what}: its answer is not one whole output to send back"
        )


def check_fits(
    prompt_len: int, max_tokens: int, config: EngineConfig, where: str, spec: RequestSpec | None = None
) -> None:
    if prompt_len + max_tokens > config.max_model_len:
        whole = spec is not None and (spec.prefix is not None or spec.follows is not None)
        what = f"its whole prompt ({prompt_len} tokens) + max_tokens" if whole else "prompt_len + max_tokens"
        raise InputError(f"{where}: {what} = {prompt_len + max_tokens} exceeds max_model_len {config.max_model_len}")
    # Block 0 is vLLM's null block; a request must fit alone (drafts and lookahead included) or
    # it can never be admitted, or preempts itself forever.
    longest = min(prompt_len + max_tokens + config.num_spec_tokens + config.num_lookahead_tokens, config.max_model_len)
    blocks_needed = -(-longest // config.block_size)
    if blocks_needed > config.num_blocks - 1:
        raise InputError(
            f"{where}: needs {blocks_needed} KV blocks alone, the cache has {config.num_blocks - 1} "
            f"usable (num_blocks {config.num_blocks}, block 0 reserved)"
        )


__all__ = [
    "ACCEPTANCE_KINDS",
    "Prefix",
    "RequestSpec",
    "check_fits",
    "check_references",
    "parse_acceptance",
    "read_int",
    "read_prefixes",
    "read_request",
    "read_table",
]
