"""Ground truth of a workload: every request's expected token sequence and its drafter's proposals.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. The runner's drafter and KV truth, the engine's token check and the
scheduler's prompts all come from here (`prompt`: workloads/prompts.py resolves a request's
shared prefix or the conversation before it), so one workload gives the same tokens whatever
implementation or schedule runs it.

A streaming session has one expected sequence per turn: turn t + 1 starts from turn t's
sequence cut after its prompt and all but its last output (what vLLM keeps), then the chunk of
input tokens the turn appends. Callers name the turn by its prompt length (they grow strictly).

The runner asks for a whole batch at once (`draft_rows`): each request's expected sequence is
a list extended in bulk when a position past its end is asked for, its draft correctness a
byte string per request and turn extended the same way, and a batch's drafts one numpy
gather and select over the rows (a subclass that answers `drafts` itself, the recorded oracle,
is asked row by row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specreplay.replay.workloads import tokens
from specreplay.replay.workloads.workload import RequestSpec, Workload
from specreplay.traces.families import EngineLine
from specreplay.traces.header import Inputs


@dataclass(frozen=True)
class ReplayContext:
    """What a replay's oracle knows of the recording whose outcomes it holds, fixed when it is
    built (workflows/replaying.py `plan_replay`): where the recording is, how its run stepped,
    its inputs metadata and how it wrote token ids."""

    source: str = ""  # the recording's path, for the replay's metadata
    # The recording's engine stepped until its batches were applied (the loop engines, a live run
    # driven to idle); False: it stopped once nothing was left to feed or schedule.
    drains_at_end: bool = True
    # An in-process live engine core: stepped an iteration at a time, as specreplay's live driver
    # steps it (every iteration numbered as a step).
    like_live: bool = False
    trace_inputs: Inputs | None = None  # the recording's inputs metadata, kept by its replay
    tokens: str | None = None  # how the recording wrote token ids (traces/pseudonym.py)


class Oracle:
    """The tokens a correct engine produces, and the drafter's proposals. Its contract with the
    engines is its attributes, every one defaulted here: the engines read them, never probe."""

    #: Outcomes read from a recording (a replay: workloads of the families' `outcomes` modules);
    #: the run's metadata notes them (engines/run.py `on_outcomes`).
    recorded = False
    #: The engine line whose scheduler and worker a recording's outcomes are for (a synthetic
    #: oracle's tokens are every engine's).
    line = EngineLine.VLLM
    #: What the reference runner drafts with: the seeded fixed-k drafter, or a recording's drafter.
    drafter = "fixed"
    #: A streaming session's next turn keeps every output of the turn before it, its last sampled
    #: token included (SGLang's `Session.create_req`); False: all but that token, never computed
    #: (vLLM's streaming contract). The engine whose turns the oracle runs sets it (families/sglang/loop.py).
    turn_keeps_last_sampled = False
    #: Steps where the recorded engine stepped with nothing unfinished (only a recording has them).
    announce_steps: frozenset[int] = frozenset()
    #: What the replay knows of its recording (the defaults: a synthetic run, as the shipped goldens
    #: were recorded: it steps while requests are unfinished and drains its batches at the end).
    context = ReplayContext()

    @property
    def drains_at_end(self) -> bool:
        return self.context.drains_at_end

    @property
    def like_live(self) -> bool:
        return self.context.like_live

    def __init__(self, workload: Workload, context: ReplayContext | None = None) -> None:
        self.workload = workload
        if context is not None:
            self.context = context
        self.vocab = workload.config.vocab_size
        self.specs: dict[str, RequestSpec] = {spec.request_id: spec for spec in workload.requests}
        self._hash = {rid: tokens.request_hash(workload.seed, rid) for rid in self.specs}
        self._expected: dict[tuple[str, int], list[int]] = {}  # (request, turn) -> sequence
        self._prompts = workload.prompts
        self._acceptance = {rid: workload.acceptance_for(spec) for rid, spec in self.specs.items()}
        # Requests with listed verification rounds (`acceptance = [2, 0, 3]`): their drafter rule
        # by position (tokens.DraftRule); the others follow their rule alone.
        self._listed = {
            rid: workload.draft_rule(spec) for rid, spec in self.specs.items() if isinstance(spec.acceptance, tuple)
        }
        self._correct: dict[str, bytearray] = {}  # random acceptance: 1 where the draft is right, by position
        #: Per streaming request: each turn's input (tokens, max_tokens), in the order they arrive.
        self.inputs: dict[str, list[tuple[int, int]]] = {}
        # Per streaming request: each turn's (prompt length, max_tokens) as the run reaches it, and
        # the turn by prompt length. A turn's prompt length is the run's (an engine can give it
        # one token more than it should hold: `kept_before`), so it is known only when the run
        # gets there: a prompt length not seen before, longer than the last turn's, is the next
        # turn's (before, such a turn read as the first turn, and drafted its tokens).
        self._turns: dict[str, list[tuple[int, int]]] = {}
        self._turn_of: dict[str, dict[int, int]] = {}
        for rid, spec in self.specs.items():
            if not spec.streaming:
                continue
            self.inputs[rid] = workload.turns(spec)
            self._turns[rid] = [self.inputs[rid][0]]
            self._turn_of[rid] = {self.inputs[rid][0][0]: 0}

    def hash(self, rid: str) -> int:
        return self._hash[rid]

    def summary(self) -> dict[str, int]:
        """What a recording gave (token positions, proposals, conflicts): a recorded oracle says;
        the workload's own tokens were given by nothing."""
        return {}

    def unobserved(self, table: Any) -> dict[str, int]:
        """On a replay's rows, what a recorded oracle filled by its rules: nothing here."""
        return {}

    def prompt(self, rid: str) -> list[int]:
        """The request's prompt: a shared prefix or the turns before it, then its own text."""
        return self._prompts.of(rid)

    def prompt_length(self, rid: str) -> int:
        """Its whole prompt's length (the workload's `prompt_len` counts its own text only)."""
        return self._prompts.length(rid)

    def turn(self, rid: str, prompt_len: int | None) -> int:
        """The turn of a request whose current prompt has `prompt_len` tokens (None: the first)."""
        if prompt_len is None or rid not in self._turn_of:
            return 0
        known = self._turn_of[rid].get(prompt_len)
        if known is not None:
            return known
        turns = self._turns[rid]
        if prompt_len <= turns[-1][0] or len(turns) == len(self.inputs[rid]):
            return 0
        turns.append((prompt_len, self.inputs[rid][len(turns)][1]))
        self._turn_of[rid][prompt_len] = len(turns) - 1
        return len(turns) - 1

    def kept_before(self, rid: str, turn: int) -> int:
        """How many tokens of the turns before `turn` (>= 1, reached) its prompt should hold: the
        turn before's prompt and outputs but its last sampled token, never computed (vLLM's
        streaming contract, and 0.33.0's behaviour). vLLM 0.32.0 keeps that token too when a
        verified draft computed it (a turn cut inside accepted drafts): the turn then runs from
        the wrong position, and T1 says so (the `sync-streaming-turn-runs-on` known bug). SGLang's
        turn keeps it by contract (`turn_keeps_last_sampled`)."""
        before_len, before_max = self._turns[rid][turn - 1]
        return before_len + before_max - (0 if self.turn_keeps_last_sampled else 1)

    def chunk(self, rid: str, turn: int) -> list[int]:
        """The input tokens a streaming session's turn `turn` (>= 1) appends."""
        length = self.inputs[rid][turn][0]
        return tokens.prompt_tokens(self.workload.seed, f"{rid}/turn{turn}", length, self.vocab)

    def expected(self, rid: str, prompt_len: int | None = None) -> list[int]:
        """Prompt then true outputs (of the turn whose prompt has `prompt_len` tokens), long
        enough for any position a run can reach."""
        turn = self.turn(rid, prompt_len)
        seq = self._expected.get((rid, turn))
        if seq is None:
            extra = 2 * self.workload.config.num_spec_tokens + 2
            if turn == 0:
                length = self.prompt_length(rid) + self.specs[rid].max_tokens + extra
                seq = tokens.continue_tokens(self._hash[rid], self._prompts.of(rid), length, self.vocab)
            else:
                before_len = self._turns[rid][turn - 1][0]
                seq = self.expected(rid, before_len)
                seq = seq[: self.kept_before(rid, turn)] + self.chunk(rid, turn)
                prompt_len, max_tokens = self._turns[rid][turn]
                h = self._hash[rid]
                while len(seq) < prompt_len + max_tokens + extra:
                    seq.append(tokens.next_token(h, len(seq) - 1, seq[-1], self.vocab))
            self._expected[(rid, turn)] = seq
        return seq

    def token_at(self, rid: str, position: int, prompt_len: int | None = None) -> int:
        seq = self.expected(rid, prompt_len)
        if len(seq) <= position:
            self._extend(rid, seq, position + 1)
        return seq[position]

    def _extend(self, rid: str, seq: list[int], length: int) -> None:
        """Extend `seq` (an expected sequence, in place) to `length` tokens by the model's rule."""
        h, vocab, last = self._hash[rid], self.vocab, seq[-1]
        for q in range(len(seq), length):
            last = (tokens.MUL_TOKEN * last + tokens.MUL_POS * (q - 1) + h) % vocab
            seq.append(last)

    def stop_token(self, rid: str) -> int | None:
        """The stop token id of a request with `stop_at = N`: its expected N-th output token. Like
        vLLM's stop_token_ids, the request stops at the first output equal to it (which can come
        before the N-th output when that token id also occurs earlier)."""
        spec = self.specs[rid]
        if spec.stop_at is None:
            return None
        return self.token_at(rid, self.prompt_length(rid) + spec.stop_at - 1)

    def drafts(self, rid: str, first_position: int, k: int, prompt_len: int | None = None) -> list[int]:
        seq = self.expected(rid, prompt_len)
        if len(seq) < first_position + k:
            self._extend(rid, seq, first_position + k)
        true = seq[first_position : first_position + k]
        correct = self._correctness(rid, first_position, k)
        return [t if c else (t + 1) % self.vocab for t, c in zip(true, correct)]

    def _correctness(self, rid: str, first_position: int, k: int) -> bytes | bytearray | list[bool]:
        """Is the draft for positions first_position.. the true token (the acceptance rule)?"""
        listed = self._listed.get(rid)
        if listed is not None:
            seed = self.workload.seed
            return [listed.correct(seed, rid, q) for q in range(first_position, first_position + k)]
        kind, p = self._acceptance[rid]
        if kind == "all" or kind == "none":
            return [kind == "all"] * k
        if kind == "alternate":
            return [q % 2 == 0 for q in range(first_position, first_position + k)]
        known = self._correct.setdefault(rid, bytearray())
        if len(known) < first_position + k:  # extended in bulk: the rule is per (seed, request, position)
            seed = self.workload.seed
            known.extend(
                tokens.draft_is_correct(kind, p, seed, rid, q) for q in range(len(known), 2 * (first_position + k))
            )
        return known[first_position : first_position + k]

    def draft_rows(
        self, rids: list[str], first_positions: list[int], k: int, prompt_lens: list[int | None]
    ) -> np.ndarray:
        """`drafts` for a batch of rows at once: an int64 array [rows, k]. The true tokens are
        sliced from each row's expected sequence, then the acceptance rule is applied to the whole
        batch (a subclass with its own `drafts` is asked row by row)."""
        rows = len(rids)
        if type(self).drafts is not Oracle.drafts or rows == 0 or k == 0:
            out = [self.drafts(r, f, k, pl) for r, f, pl in zip(rids, first_positions, prompt_lens)]
            return np.array(out, dtype=np.int64).reshape(rows, k)
        true = np.empty((rows, k), dtype=np.int64)
        correct = np.empty((rows, k), dtype=bool)
        expected, acceptance = self.expected, self._acceptance
        for x, (rid, first, pl) in enumerate(zip(rids, first_positions, prompt_lens)):
            seq = expected(rid, pl)
            if len(seq) < first + k:
                self._extend(rid, seq, first + k)
            true[x] = seq[first : first + k]
            kind = acceptance[rid][0]
            if (kind == "all" or kind == "none") and rid not in self._listed:
                correct[x] = kind == "all"
            else:
                correct[x] = self._correctness(rid, first, k)
        return np.where(correct, true, (true + 1) % self.vocab)

    def mismatches(
        self, rid: str, first_output_index: int, tokens: tuple[int, ...] | list[int], prompt_len: int | None = None
    ) -> int:
        """How many of `tokens`, appended as outputs starting at `first_output_index` (of the
        turn whose prompt has `prompt_len` tokens), differ from the expected outputs."""
        base = (self.prompt_length(rid) if prompt_len is None else prompt_len) + first_output_index
        if type(self).token_at is not Oracle.token_at:
            return sum(1 for j, t in enumerate(tokens) if t != self.token_at(rid, base + j, prompt_len))
        seq = self.expected(rid, prompt_len)
        if len(seq) < base + len(tokens):
            self._extend(rid, seq, base + len(tokens))
        return sum(1 for t, e in zip(tokens, seq[base : base + len(tokens)]) if t != e)


#: How specreplay's driver steps a live vLLM in process (families/vllm/live.py): every iteration is
#: a step, one that only applies a batch included, and a crash is named by the iteration it
#: happened in. The driver steps until the engine core is idle (EngineCoreProc's has_work), so the
#: run drains: the requests that finished last are announced by a schedule of their own, which
#: applies the batch still in flight (engines/loop.py has_unannounced).
LIVE_DRIVEN = ReplayContext(drains_at_end=True, like_live=True)


def live_driven(workload: Workload) -> Oracle:
    """The workload's oracle, for a run stepped as specreplay drives a live vLLM in process, so
    that the two traces compare row for row (the runner differential)."""
    return Oracle(workload, context=LIVE_DRIVEN)
