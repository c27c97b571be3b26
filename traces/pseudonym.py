"""Pseudonymised token ids: what a recording writes of its users' tokens, through a keyed permutation.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli, beside the part files' format (traces/parts.py). A recording of a
deployment holds its users' prompts and outputs as token ids. With `SPECREPLAY_TOKENS=pseudonym`
(families/vllm/attached.py) every token id a part file holds goes through one permutation of the
vocabulary `[0, vocab)`, drawn from a key per recording, on the part writer's background thread
(never the engine's): the prompts and stop token ids of the recorded inputs, and the trace columns
that hold ids (`TOKEN_COLUMNS`). A permutation is a bijection, so every equality the engines
depend on holds as recorded: an n-gram drafter's matches, a stop token reached, a sampled token fed
back as the next input, a draft accepted because it equals the sampled one. Ids outside the
vocabulary (the -1 placeholders a buggy runner feeds its model, an out-of-range id) are kept as they
are, so what a finding names stays named. The content does not survive: without the key, an id says
nothing of the token it stands for.

The key is drawn once per run (`secrets`, 32 bytes) by the first process that records, and left in
the recording folder beside the parts, readable by its owner only (`key_path`): the other processes
of the run read it there, so all of them permute alike. `specreplay merge` never copies it into a
trace: a merged trace can be shared, and the key stays on the machine unless its owner copies it
(with it, `Pseudonym.reveal` maps ids back; delete it and nobody can).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import secrets
from typing import Any

from specreplay.traces.errors import InputError

TOKENS_ENV = "SPECREPLAY_TOKENS"
#: plain: token ids as the engine had them; pseudonym: through the run's permutation.
MODES = ("plain", "pseudonym")
#: The trace columns that hold token ids (lists of ids; traces/schema.py).
TOKEN_COLUMNS = frozenset({"apply_sampled_token_ids", "worker_draft_ids", "worker_sampled_ids"})
#: The recorded inputs' fields that hold token ids, by event (observers/input_observer.py).
INPUT_TOKEN_FIELDS = {"request": ("prompt", "stop_token_ids"), "stream": ("prompt",)}


def token_mode() -> str:
    """The mode this process records in (SPECREPLAY_TOKENS; unset: plain)."""
    mode = os.environ.get(TOKENS_ENV) or "plain"
    if mode not in MODES:
        raise InputError(f"{TOKENS_ENV}={mode!r}: expected one of {', '.join(MODES)}; nothing was recorded")
    return mode


class Pseudonym:
    """The permutation of `[0, vocab)` that `key` draws; ids outside it map to themselves."""

    def __init__(self, key: bytes, vocab: int) -> None:
        if vocab <= 0:
            raise InputError(f"pseudonymised tokens need the model's vocabulary size, got {vocab}")
        self.vocab = vocab
        # The seed binds the vocabulary too: one key never draws related permutations of two sizes.
        seed = int.from_bytes(hashlib.sha256(b"specreplay-tokens\0" + key + vocab.to_bytes(8, "big")).digest(), "big")
        self.table = list(range(vocab))
        random.Random(seed).shuffle(self.table)  # Fisher-Yates on a seeded Mersenne Twister: every id once
        self._inverse: list[int] | None = None

    def ids(self, values: Any) -> Any:
        """A list (or tuple: JSON writes both as a list) of token ids through the permutation, as a
        list; None, or anything else, as it is."""
        if not isinstance(values, (list, tuple)):
            return values
        table, vocab = self.table, self.vocab
        return [table[t] if type(t) is int and 0 <= t < vocab else t for t in values]

    def reveal(self, values: list[int]) -> list[int]:
        """The ids the engine had, for the key's owner."""
        if self._inverse is None:
            inverse = [0] * self.vocab
            for plain, shown in enumerate(self.table):
                inverse[shown] = plain
            self._inverse = inverse
        inverse, vocab = self._inverse, self.vocab
        return [inverse[t] if 0 <= t < vocab else t for t in values]

    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        """A part file's event with its token ids permuted (a new dict where anything changed:
        the observers may still hold the lists they handed over)."""
        kind = event.get("e")
        if kind in INPUT_TOKEN_FIELDS:
            changed = {name: self.ids(event.get(name)) for name in INPUT_TOKEN_FIELDS[kind] if name in event}
            if "stop_token_ids" in changed:
                changed["stop_token_ids"] = sorted(changed["stop_token_ids"])  # recorded sorted
            return {**event, **changed}
        if kind == "rows":
            at = [i for i, name in enumerate(event["names"]) if name in TOKEN_COLUMNS]
            if not at:
                return event
            rows = []
            for row in event["rows"]:
                row = list(row)
                for i in at:
                    row[i] = self.ids(row[i])
                rows.append(row)
            return {**event, "rows": rows}
        if kind == "patch":
            return {**event, "rows": [[step, rid, self._values(values)] for step, rid, values in event["rows"]]}
        if kind == "cols":
            cols = event["cols"]
            if TOKEN_COLUMNS.isdisjoint(cols):
                return event
            permuted = {n: [self.ids(v) for v in vs] if n in TOKEN_COLUMNS else vs for n, vs in cols.items()}
            return {**event, "cols": permuted}
        return event

    def _values(self, values: dict[str, Any]) -> dict[str, Any]:
        if TOKEN_COLUMNS.isdisjoint(values):
            return values
        return {n: self.ids(v) if n in TOKEN_COLUMNS else v for n, v in values.items()}


def key_path(folder: str, run: str) -> str:
    return os.path.join(folder, f"tokens-{run}.key")


def for_recording(folder: str, run: str, vocab: int) -> Pseudonym:
    """The run's permutation: its key drawn by the first process that asks, read by the others
    (created whole or not at all: written aside, then linked into place, so a process racing it
    reads either nothing or the whole key)."""
    path = key_path(folder, run)
    if not os.path.exists(path):
        aside = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, json.dumps({"run": run, "vocab": vocab, "key": secrets.token_hex(32)}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process of the run drew it first: theirs
            os.link(aside, path)
        os.unlink(aside)
    return read_key(path, vocab)


def read_key(path: str, vocab: int) -> Pseudonym:
    """The permutation a key file holds, for a model of `vocab` ids."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        key, recorded_vocab = bytes.fromhex(doc["key"]), int(doc["vocab"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a readable token key ({exc}); nothing was recorded") from None
    if recorded_vocab != vocab:
        raise InputError(
            f"{path}: drawn for a vocabulary of {recorded_vocab} ids, this process's model has {vocab}; "
            "nothing was recorded"
        )
    return Pseudonym(key, vocab)
