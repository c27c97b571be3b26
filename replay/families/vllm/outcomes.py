"""Recorded outcomes as the oracle: a trace's sampled tokens and drafts drive a replay.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. `specreplay replay RECORDING` builds a `RecordedOracle` from the
recording's rows and hands it to the engine in place of the synthetic one, so the target model
returns, for each position of each request, the token the recorded run sampled there, and the
drafter proposes the drafts the recorded worker verified. Acceptance is not stored: it follows, as
in the recorded run, from the drafts and the tokens.

What a row tells (worker view of step m, the output the scheduler received for it): the worker
wrote its inputs at positions `P .. P + n - 1` (`worker_first_position`, `n` tokens), the last
`d` of them drafts (`worker_draft_ids`); the sampled tokens `apply_sampled_token_ids` are the
tokens at positions `P + n - d`, `P + n - d + 1`, ... The first is the model's answer to the
input at `q0 = P + n - d - 1`, the following ones its answers to the accepted drafts.

The model is read as a function of (request, turn, position, input token), as the synthetic
one is. One rule each for what the recording never observed:

- **a position past what was recorded** (a request run longer, a draft verified where the
  recording had none): the synthetic model's token, `tokens.next_token` of the previous token;
- **an input the recording never fed at that position** (a clamped -1, a stale draft): the
  synthetic model's token for that input, moved on by one when it would equal the recorded
  token (a wrong input never yields the right token by chance);
- **a proposal the recording never verified**: a fixed-k drafter proposes tokens that are
  rejected (the expected token + 1); an n-gram drafter proposes nothing (no valid draft; the
  reference Model Runner V2 then pads the slot with the last sampled token, as vLLM's does);
- **the part of a GPU n-gram proposal the scheduler cut** (it booked fewer slots than
  placeholders: max_model_len, the token budget; the worker kept every one): rejected tokens up
  to the k it booked for. The drafter's count was at least the booking, and the runner trims a
  later booking against it while the drafter sits out a step near max_model_len.

A Model Runner V2 recording (`runner_family` v2) verifies whatever its slot holds: every draft a
row fed, the n-gram speculator's padding included, is that slot's proposal for that position.

`unobserved(table)` counts, on a replay's rows, the emitted tokens and verified drafts that
came from these rules: `info` shows it, and a replay that reproduces its recording has none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from specreplay.replay.families.vllm.recorded_inputs import RecordedInputs
from specreplay.replay.workloads import tokens
from specreplay.replay.workloads.oracle import Oracle, ReplayContext
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError
from specreplay.traces.header import ImplHeader

#: The columns a recording needs for its outcomes to drive a replay.
COLUMNS = (
    "step",
    "request_id",
    "sched_num_prompt_tokens",
    "sched_num_draft_slots",
    "sched_spec_len",
    "worker_first_position",
    "worker_num_scheduled_tokens",
    "worker_num_draft_slots",
    "worker_draft_ids",
    "worker_negative_inputs",
    "worker_cached_drafts",
    "worker_num_accepted",
    "worker_num_emitted",
    "apply_sampled_token_ids",
    "apply_num_tokens",
)

#: Drafter kinds a replay models. fixed: k proposals every step (the reference's seeded drafter);
#: ngram: vLLM's CPU n-gram drafter under sync scheduling (0..k drafts back to the scheduler);
#: ngram_gpu: vLLM's GPU n-gram drafter under async scheduling (k placeholder slots booked, the
#: runner trims them to the valid count).
DRAFTERS = ("fixed", "ngram", "ngram_gpu")


@dataclass
class Observed:
    """What a recording observed of one request turn."""

    tokens: dict[int, int] = field(default_factory=dict)  # position -> token, from a right input
    wrong: dict[tuple[int, int], int] = field(default_factory=dict)  # (position, input) -> next token
    drafts: dict[int, list[int]] = field(default_factory=dict)  # first draft position -> drafts verified
    proposed: dict[int, int] = field(default_factory=dict)  # first draft position -> proposal length
    conflicts: int = 0  # positions recorded twice with different tokens (the first is kept)


#: A row the worker ran, as `RecordedOracle._worker_rows` reads it: its index, its columns, its
#: request turn's record, the position of its first draft, its drafts.
WorkerRow = tuple[int, dict[str, Any], Observed, int, list[int]]


def drafter_of(impl: ImplHeader) -> str:
    """The drafter a trace's run used: a live engine names it; the reference's is fixed-k."""
    drafter = impl.drafter
    return drafter if drafter in DRAFTERS else "fixed"


def has_outcomes(table: Any, column: str = "apply_sampled_token_ids") -> bool:
    """Does a trace carry recorded outcomes: the sampled token ids on some row (a vLLM trace's
    `apply_sampled_token_ids`, schema v3; an SGLang trace's `worker_sampled_ids`, v7)?"""
    if column not in table.column_names:
        return False
    return table.column(column).null_count < table.num_rows


class RecordedOracle(Oracle):
    """The oracle of a replay of a recording: recorded tokens and drafts, one rule per gap."""

    recorded = True

    def __init__(
        self,
        workload: Workload,
        table: Any,
        drafter: str = "fixed",
        inputs: RecordedInputs | None = None,
        slot_drafts: bool = False,
        context: ReplayContext | None = None,
    ) -> None:
        super().__init__(workload, context)
        # `slot_drafts`: the recorded runner verifies what its slot holds (Model Runner V2: the
        # registry's `verifies_slot_drafts`), so every draft a row fed was proposed (an n-gram
        # slot without a match holds the last sampled token: padding, but proposed).
        self.slot_drafts = slot_drafts
        # An attached run's own prompts, chunks and stop tokens (recorded_inputs.py); None: the
        # workload's seeded ones, which specreplay fed the engines it drove. `announce_steps`
        # tell the input driver where the recorded engine stepped with nothing unfinished.
        self.recorded_inputs = inputs
        self.announce_steps = inputs.announce_steps if inputs is not None else frozenset()
        self.drafter = drafter
        self.observed: dict[tuple[str, int], Observed] = defaultdict(Observed)
        self._chain: dict[tuple[str, int], list[int]] = {}
        self._synthetic: Oracle | None = None  # what specreplay fed the recorded engine (stop token ids)
        self._read(table)

    # ------------------------------------------------------------------ reading the recording
    def _worker_rows(self, table: Any, columns: tuple[str, ...]) -> Iterator[WorkerRow]:
        """The rows on which the worker ran a request of the workload, in order, each with its index,
        its `columns`, its request turn's record, the position of its first draft (of its first
        sampled token) and its drafts; every row's prompt length checked against the workload."""
        cols = {name: table.column(name).to_pylist() for name in columns}
        for i in range(table.num_rows):
            row = {name: cols[name][i] for name in columns}
            rid = row["request_id"]
            if rid not in self.specs or row["worker_first_position"] is None:
                continue
            self._check_prompt(row)
            seen = self.observed[(rid, self.turn(rid, row["sched_num_prompt_tokens"]))]
            n, d = row["worker_num_scheduled_tokens"], row["worker_num_draft_slots"] or 0
            yield i, row, seen, row["worker_first_position"] + n - d, list(row["worker_draft_ids"] or [])

    def _read(self, table: Any) -> None:
        # Model Runner V2's worker view has every token it sampled, those a stop cut off included.
        v2 = self.slot_drafts and "worker_sampled_ids" in table.column_names
        full_sampled = table.column("worker_sampled_ids").to_pylist() if v2 else [None] * table.num_rows
        for i, row, seen, first_draft, drafts in self._worker_rows(table, COLUMNS):
            if self._drafts_are_proposals(row, drafts):
                seen.drafts.setdefault(first_draft, drafts)
                seen.proposed.setdefault(first_draft, max(self._proposal_length(row, drafts), len(drafts)))
            sampled = row["apply_sampled_token_ids"]
            full = full_sampled[i]
            if full and full[: len(sampled or ())] == list(sampled or ()):
                for j, token in enumerate(full):  # MRV2 clamps nothing: the first answers q0's right input
                    self._note(seen, first_draft + j, token)
            if not sampled:
                # An output never applied (its request had finished) still shows its accepted
                # drafts: each is the token at its own position.
                if row["worker_num_accepted"] and self._drafts_are_proposals(row, drafts):
                    for j, token in enumerate(drafts[: row["worker_num_accepted"]]):
                        self._note(seen, first_draft + j, token)
                continue
            self._check_row(row, sampled, drafts)
            # The first sampled token answers the input at q0: the right token, or 0 when a
            # negative id there was clamped (negatives beyond the drafts' own).
            clamped = (row["worker_negative_inputs"] or 0) - sum(1 for t in drafts if t < 0) > 0
            position = first_draft
            if clamped:
                seen.wrong.setdefault((position - 1, 0), sampled[0])
            else:
                self._note(seen, position, sampled[0])
            for j, token in enumerate(sampled[1:], start=1):  # answers to accepted drafts
                self._note(seen, position + j, token)

    def _proposal_length(self, row: dict[str, Any], drafts: list[int]) -> int:
        """How many drafts the drafter proposed for a row's first draft position. The CPU n-gram
        drafter's proposal is the request's spec tokens. The GPU one books k placeholders and the
        runner trims them to the valid count, so the drafts the row kept are the proposal, except
        where the scheduler booked fewer slots than placeholders (max_model_len, the token budget)
        and the worker kept every one: the drafter's count was then at least the booking, and the
        runner keeps that count for the row while the drafter sits out a step near max_model_len
        (the next booking is trimmed against it), so the proposal is the whole k it booked."""
        if self.slot_drafts:
            return len(drafts)
        if self.drafter == "ngram":
            return row["sched_spec_len"]
        booked = row["sched_num_draft_slots"] or 0
        spec_len = row["sched_spec_len"] or 0
        if self.drafter == "ngram_gpu" and booked < spec_len and len(drafts) == booked:
            return spec_len
        return len(drafts)

    def _drafts_are_proposals(self, row: dict[str, Any], drafts: list[int]) -> bool:
        """Drafts the drafter proposed (not placeholders nobody filled): under async scheduling
        they came from a cached row, in sync mode from the scheduler's spec tokens."""
        if any(t < 0 for t in drafts):
            return False
        if self.slot_drafts:
            return bool(drafts)
        if self.workload.config.async_scheduling:
            return bool(row["worker_cached_drafts"]) or row["sched_num_draft_slots"] == 0
        return True

    @staticmethod
    def _note(seen: Observed, position: int, token: int) -> None:
        old = seen.tokens.setdefault(position, token)
        if old != token:
            seen.conflicts += 1

    def _check_prompt(self, row: dict[str, Any]) -> None:
        """The rows' prompt length is one the workload gives the request (a turn's, streaming)."""
        rid, length = row["request_id"], row["sched_num_prompt_tokens"]
        spec = self.specs[rid]
        if spec.streaming:  # a turn's prompt holds what the turns before it produced: no fixed length
            return
        if length != self.prompt_length(rid):
            raise InputError(
                f"recorded outcomes inconsistent at step {row['step']}, request {rid!r}: its prompt has "
                f"{length} tokens in the rows, {self.prompt_length(rid)} in the workload"
            )

    def _check_row(self, row: dict[str, Any], sampled: list[int], drafts: list[int]) -> None:
        """A row whose outcome contradicts itself cannot drive a replay: one line, exit 2."""
        where = f"step {row['step']}, request {row['request_id']!r}"
        accepted, emitted = row["worker_num_accepted"], row["worker_num_emitted"]
        if accepted is not None and accepted > len(drafts):
            raise InputError(
                f"recorded outcomes inconsistent at {where}: {accepted} drafts accepted of {len(drafts)} verified"
            )
        if emitted and emitted != len(sampled):  # 0: a sync-mode live worker does not count them
            raise InputError(
                f"recorded outcomes inconsistent at {where}: the worker emitted {emitted} tokens, "
                f"the scheduler received {len(sampled)}"
            )
        if len(sampled) > len(drafts) + 1:
            raise InputError(
                f"recorded outcomes inconsistent at {where}: {len(sampled)} tokens sampled with "
                f"{len(drafts)} drafts (at most 1 + drafts)"
            )
        if row["apply_num_tokens"] is not None and row["apply_num_tokens"] > len(sampled):
            raise InputError(
                f"recorded outcomes inconsistent at {where}: {row['apply_num_tokens']} tokens applied of "
                f"{len(sampled)} sampled"
            )
        if any(t < 0 or t >= self.vocab for t in sampled):
            raise InputError(
                f"recorded outcomes inconsistent at {where}: a sampled token outside the vocabulary "
                f"(0..{self.vocab - 1})"
            )

    # ------------------------------------------------------------------ the model
    def _seen(self, rid: str, prompt_len: int | None) -> Observed:
        return self.observed.get((rid, self.turn(rid, prompt_len))) or Observed()

    def expected(self, rid: str, prompt_len: int | None = None) -> list[int]:
        """Prompt then the recorded tokens, a gap filled by the synthetic rule, long enough for
        any position a run can reach (as the synthetic oracle's)."""
        turn = self.turn(rid, prompt_len)
        seq = self._chain.get((rid, turn))
        if seq is None:
            if turn == 0:
                seq = self.prompt(rid)
            else:
                before_len = self._turns[rid][turn - 1][0]
                seq = self.expected(rid, before_len)[: self.kept_before(rid, turn)] + self.chunk(rid, turn)
            self._chain[(rid, turn)] = seq
            length, max_tokens = (
                (self.prompt_length(rid), self.specs[rid].max_tokens) if turn == 0 else self._turns[rid][turn]
            )
            self._extend_turn(rid, turn, seq, length + max_tokens + 2 * self.workload.config.num_spec_tokens + 2)
        return seq

    def _extend_turn(self, rid: str, turn: int, seq: list[int], length: int) -> None:
        known = self.observed.get((rid, turn))
        h = self._hash[rid]
        while len(seq) < length:
            q = len(seq)
            token = known.tokens.get(q) if known is not None else None
            seq.append(token if token is not None else tokens.next_token(h, q - 1, seq[-1], self.vocab))

    def token_at(self, rid: str, position: int, prompt_len: int | None = None) -> int:
        seq = self.expected(rid, prompt_len)
        if len(seq) <= position:
            self._extend_turn(rid, self.turn(rid, prompt_len), seq, position + 1)
        return seq[position]

    def answer(self, rid: str, prompt_len: int, position: int, token: int) -> int:
        """The target model's token for position + 1 given `token` at `position`."""
        if token == self.token_at(rid, position, prompt_len):
            return self.token_at(rid, position + 1, prompt_len)
        recorded = self._seen(rid, prompt_len).wrong.get((position, token))
        if recorded is not None:
            return recorded
        guess = tokens.next_token(self._hash[rid], position, token, self.vocab)
        right = self.token_at(rid, position + 1, prompt_len)
        return guess if guess != right else (guess + 1) % self.vocab

    def prompt(self, rid: str) -> list[int]:
        """An attached run's recorded prompt; else the workload's seeded one."""
        length = self.prompt_length(rid)
        recorded = None if self.recorded_inputs is None else self.recorded_inputs.prompt(rid, length)
        return recorded if recorded is not None else super().prompt(rid)

    def chunk(self, rid: str, turn: int) -> list[int]:
        """An attached run's recorded input chunk; else the workload's seeded one."""
        length = self.inputs[rid][turn][0]
        recorded = None if self.recorded_inputs is None else self.recorded_inputs.chunk(rid, turn, length)
        return recorded if recorded is not None else super().chunk(rid, turn)

    def stop_token(self, rid: str) -> int | None:
        """The stop token id the recorded run was given: the synthetic model's N-th output token
        of a `stop_at = N` request, whatever the recorded model produced there; an attached run's
        from its recorded sampling parameters and outputs (recorded_inputs.py)."""
        if self.recorded_inputs is not None:
            return self.recorded_inputs.stop_token(rid)
        if self._synthetic is None:
            self._synthetic = Oracle(self.workload)
        return self._synthetic.stop_token(rid)

    # ------------------------------------------------------------------ the drafter
    def drafts(self, rid: str, first_position: int, k: int, prompt_len: int | None = None) -> list[int]:
        """The drafts proposed for positions first_position.. : the recorded ones; the rest of a
        proposal rejected tokens. An n-gram drafter's proposal is as long as recorded (none
        when the recording never saw it), a fixed-k drafter's always k."""
        seen = self._seen(rid, prompt_len)
        drafts = list(seen.drafts.get(first_position, ()))[:k]
        length = k if self.drafter == "fixed" else min(k, seen.proposed.get(first_position, 0))
        for q in range(first_position + len(drafts), first_position + length):
            drafts.append((self.token_at(rid, q, prompt_len) + 1) % self.vocab)
        return drafts

    # ------------------------------------------------------------------ what was filled
    def is_observed_token(self, rid: str, prompt_len: int, position: int) -> bool:
        seen = self._seen(rid, prompt_len)
        return position < prompt_len or position in seen.tokens

    def unobserved(self, table: Any) -> dict[str, int]:
        """On a replay's rows: emitted tokens at positions the recording never observed, and
        verified drafts it never proposed, as the rules above filled them."""
        names = (
            "request_id",
            "sched_num_prompt_tokens",
            "worker_first_position",
            "worker_num_scheduled_tokens",
            "worker_num_draft_slots",
            "worker_draft_ids",
            "worker_num_emitted",
        )
        cols = {name: table.column(name).to_pylist() for name in names}
        filled_tokens = filled_drafts = 0
        for i in range(table.num_rows):
            rid, plen = cols["request_id"][i], cols["sched_num_prompt_tokens"][i]
            start = cols["worker_first_position"][i]
            if start is None or rid not in self.specs:
                continue
            first_draft = start + cols["worker_num_scheduled_tokens"][i] - (cols["worker_num_draft_slots"][i] or 0)
            emitted = cols["worker_num_emitted"][i] or 0
            filled_tokens += sum(1 for j in range(emitted) if not self.is_observed_token(rid, plen, first_draft + j))
            drafts = cols["worker_draft_ids"][i] or []
            recorded = self._seen(rid, plen).drafts.get(first_draft, [])
            filled_drafts += max(0, len([t for t in drafts if t >= 0]) - len(recorded))
        return {"tokens": filled_tokens, "drafts": filled_drafts}

    def summary(self) -> dict[str, int]:
        """What the recording gave: token positions and proposals observed, conflicts."""
        return {
            "tokens": sum(len(s.tokens) for s in self.observed.values()),
            "proposals": sum(len(s.drafts) for s in self.observed.values()),
            "conflicts": sum(s.conflicts for s in self.observed.values()),
        }


def recorded_oracle(
    workload: Workload, trace: Any, slot_drafts: bool = False, context: ReplayContext | None = None
) -> RecordedOracle:
    """The oracle of `trace`'s recorded outcomes, refused in one line when it has none.
    `slot_drafts`: its runner verifies what each slot holds (the caller asks the registry);
    `context`: what the replay knows of the recording (workloads/oracle.py)."""
    if not has_outcomes(trace.table):
        name = trace.workload.name if trace.workload.name is not None else "the trace"
        raise InputError(
            f"{name}: no recorded outcomes (schema v{trace.schema_version} "
            "traces before v3 carry no sampled token ids); replay it with --oracle synthetic"
        )
    recorded = trace.inputs.to_dict() if trace.inputs is not None else None
    inputs = RecordedInputs.of(recorded, trace.table, "trace inputs metadata") if recorded else None
    return RecordedOracle(workload, trace.table, drafter_of(trace.impl), inputs, slot_drafts, context)
