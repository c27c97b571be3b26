"""The framework: streams a trace's row batches through the catalogue's rules, frame by frame.

Where it sits: inside check. `Checker.feed` takes batches in step order (a trace's row groups),
holds back each batch's last step until it is whole, and checks each run of whole steps as one
`Frame` (frames.py): every rule of scope "rows" runs over it. What a rule needs from earlier steps
is carried between frames: the rows of the last `LOOKBACK` steps (the frame's context) and a few
per-request values (whether the request is decoding, its cuts so far, its turn and prompt length
so far, its last status, which codes already fired for it). So memory is bounded by the batch
size, not the trace. `findings()` checks what is held back, runs the rules of scope "run" (the
run's outcome) and sorts the findings.

Rules report through `finding` (a row of the frame), `step_finding` (a whole step) or
`run_finding` (the run): they give the evidence (expected, actual and the values the message
needs, by name), and the code's catalogue row renders the Finding.

While it streams, the checker also notes which ground-truth columns hold a value anywhere;
`unchecked()` names the codes that could not run for want of them, or of the requests' limits
(coverage.py; the limits come from the trace's workload: limits.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specreplay.replay.check import catalogue, coverage
from specreplay.replay.check.catalogue import Invariant
from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import (
    FINISHED,
    LOOKBACK,
    RESET_PREEMPT,
    STREAM_TURN,
    Columns,
    Frame,
    concat,
    load_columns,
    row_range,
)
from specreplay.replay.check.limits import Limits
from specreplay.traces.families import BASELINE_FAMILY, DEFAULT_FAMILY
from specreplay.traces.header import UNOBSERVED_RUNNER, Config, Outcome, coerce

#: What `Checker._note_sampled` reads from each batch besides the checker's own columns
#: (frames.NEEDED): the worker's sampled tokens and their positions, read only where the outcome
#: holds the ids each client received.
SAMPLED_COLUMNS = (
    "request_id",
    "sched_num_prompt_tokens",
    "worker_first_position",
    "worker_num_scheduled_tokens",
    "worker_num_draft_slots",
    "worker_sampled_ids",
)


class Checker:
    """Streams batches of one trace through the rules of `invariants` (default: the whole
    catalogue; each rule runs once, however many codes it reports, and only the codes of
    `invariants` are kept); `findings()` at the end."""

    def __init__(
        self,
        config: Config | Mapping[str, Any],
        outcome: Outcome | Mapping[str, Any],
        invariants: Sequence[Invariant] | None = None,
        drafter: str | None = None,
        limits: Limits | None = None,
        runner_family: str | None = None,
        embedded: frozenset[str] = frozenset(),
    ) -> None:
        self.config = coerce(Config, config)  # a mapping: a test's hand-written header
        # Each request life's max_tokens per turn (limits.py); {}: not known, the rules that need
        # them do not run and `unchecked()` says so.
        self.limits: Limits = dict(limits or {})
        # The requests whose prompt was sent as embeddings (limits.embedded_prompts): an SGLang
        # retraction generates their outputs anew (G4).
        self.embedded = embedded
        self.outcome = coerce(Outcome, outcome)
        self.drafter = drafter  # the run's drafter when the trace names it (X11: does its runner trim?)
        self.is_async = self.config.async_scheduling is not False  # not recorded: async, the default
        self.crash_step = self.outcome.step if self.outcome.crashed else None
        # The requests whose recorded inputs at the crash step no embedding row holds (a negative
        # or out-of-vocabulary draft id fed to the model): E1 names the first where the crash
        # itself names none (a forward that raised; the worker wrote the step's inputs first).
        self.crash_inputs: list[str] = []
        # When the outcome says which token ids each client received (SGLang's scheduler): per
        # request and turn (its prompt length: a streaming session's turns grow it), output index
        # -> the token the worker last sampled at that position, from the rows as fed
        # (`_note_sampled`); G9 compares the two after the run. None: nothing to compare.
        self.sampled: dict[str, dict[int, dict[int, int]]] | None = (
            {} if self.outcome.engine_output_ids is not None else None
        )
        # The worker runner the trace recorded (engines/registry.py: v1, v2 = Model Runner V2,
        # sglang = SGLang's scheduler; an old trace names none: v1). Codes about another runner's
        # state, or another engine's scheduler, do not run on it (coverage.py says which it lists).
        self.runner_family = runner_family or DEFAULT_FAMILY
        rows = catalogue.CATALOGUE if invariants is None else tuple(invariants)
        if self.runner_family == UNOBSERVED_RUNNER:  # the scheduler view only: what needs no worker runs
            self.not_for_runner = tuple(row.code for row in rows if catalogue.about_the_worker_view(row.code))
            rows = tuple(
                row for row in rows if not catalogue.about_the_worker_view(row.code) and BASELINE_FAMILY in row.runners
            )
        else:
            self.not_for_runner = tuple(row.code for row in rows if self.runner_family not in row.runners)
            rows = tuple(row for row in rows if self.runner_family in row.runners)
        self.rules_per_frame = catalogue.rules_of(rows, "rows")
        self.rules_at_end = catalogue.rules_of(rows, "run")
        self.codes = frozenset(row.code for row in rows)
        self.ids: dict[tuple[str, int], int] = {}  # (request id, life) -> the request's code
        self.names: list[str] = []  # code -> request id
        # Per request (by code): carried from frame to frame.
        self.decoding = np.zeros(0, dtype=bool)
        self.cuts = np.zeros(0, dtype=np.int64)  # cuts (preemptions, cache resets, turn ends) so far
        self.last_status = np.full(0, -1, dtype=np.int8)
        self.last_step = np.full(0, -1, dtype=np.int64)  # the step of its last row so far
        self.turns = np.zeros(0, dtype=np.int64)  # streaming turns started so far (0: the first)
        self.last_prompt = np.full(0, -1, dtype=np.int64)  # prompt length at its last row (-1: none yet)
        self.turn_limits: list[tuple[int, ...]] = []  # code -> max_tokens per turn (empty: not known)
        self.is_embedded: list[bool] = []  # code -> was its prompt sent as embeddings
        # The same as flat arrays, extended as requests appear (`_limit_table`): a frame looks its
        # rows up in them without walking every request seen so far.
        self._limit_counts = np.zeros(0, dtype=np.int64)
        self._limit_offsets = np.zeros(0, dtype=np.int64)
        self._limit_values = np.zeros(0, dtype=np.int64)
        self.fired: dict[str, np.ndarray] = {}  # code -> has it fired for the request
        self.carried: dict[str, np.ndarray] = {}  # a rule's per-request value, carried frame to frame (-1: none)
        self.rule_state: dict[str, Any] = {}  # what else a rule carries from frame to frame, by its name
        self.context: Columns | None = None  # rows of the last LOOKBACK steps checked
        self.pending: list[Columns] = []  # rows of a step that may not be whole yet
        self.found: list[Finding] = []
        self.truth_seen: set[str] = set()  # ground-truth columns with a value in some row fed so far

    # ------------------------------------------------------------------ streaming
    def feed(self, batch: pa.Table | pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.truth_seen |= coverage.columns_with_values(batch)
        if self.crash_step is not None:
            self._note_crash_inputs(batch)
        if self.sampled is not None:
            self._note_sampled(batch)
        cols = load_columns(batch, self._code)
        # The batch's last step may continue in the next batch: hold it back until it is whole.
        whole_until = int(np.searchsorted(cols["step"], cols["step"][-1], side="left"))
        if whole_until == 0:
            self.pending.append(cols)
            return
        whole = self.pending + [row_range(cols, 0, whole_until)]
        self.pending = [row_range(cols, whole_until, None)]
        self._check_frame(whole)

    def findings(self) -> list[Finding]:
        if self.pending:
            self._check_frame(self.pending)
            self.pending = []
        for rule in self.rules_at_end:
            self.found.extend(f for f in rule(None, self) if f.code in self.codes)
        # How many lives each id has, now that the whole trace is read: reports name a finding's
        # life where its id has several (Finding.request_label).
        lives: dict[str, int] = {}
        for name, _life in self.ids:
            lives[name] = lives.get(name, 0) + 1
        self.found = [f if f.request_id is None else replace(f, lives=lives.get(f.request_id)) for f in self.found]
        self.found.sort(
            key=lambda f: (f.step, f.request_id or "", catalogue.RANK.get(f.code, len(catalogue.RANK)), f.code)
        )
        return self.found

    def unchecked(self) -> list[str]:
        """The codes of this checker that could not run on the rows fed: every ground-truth
        column they read was null in all of them (a live engine's trace), or (on a Model Runner V2
        trace) they are about V1's runner state. Catalogue order. A V1 trace does not list the
        MRV2 codes: they are not about its runner at all."""
        return coverage.unchecked(
            self.codes | set(self.not_for_runner),
            self.truth_seen,
            limits_known=bool(self.limits),
            runner_family=self.runner_family,
        )

    def _code(self, key: tuple[str, int]) -> int:
        """The code of a (request id, life); findings name the request id."""
        code = self.ids.get(key)
        if code is None:
            code = self.ids[key] = len(self.names)
            self.names.append(key[0])
            self.turn_limits.append(self.limits.get(key, ()))
            self.is_embedded.append(key[0] in self.embedded)
        return code

    def _check_frame(self, parts: list[Columns]) -> None:
        grow = len(self.names) - len(self.decoding)
        if grow > 0:
            self.decoding = np.concatenate([self.decoding, np.zeros(grow, dtype=bool)])
            self.cuts = np.concatenate([self.cuts, np.zeros(grow, dtype=np.int64)])
            self.last_status = np.concatenate([self.last_status, np.full(grow, -1, dtype=np.int8)])
            self.last_step = np.concatenate([self.last_step, np.full(grow, -1, dtype=np.int64)])
            self.turns = np.concatenate([self.turns, np.zeros(grow, dtype=np.int64)])
            self.last_prompt = np.concatenate([self.last_prompt, np.full(grow, -1, dtype=np.int64)])
            for code in self.fired:
                self.fired[code] = np.concatenate([self.fired[code], np.zeros(grow, dtype=bool)])
            for name in self.carried:
                self.carried[name] = np.concatenate([self.carried[name], np.full(grow, -1, dtype=np.int64)])
        cols = concat(([] if self.context is None else [self.context]) + parts)
        frame = Frame(cols, 0 if self.context is None else len(self.context["step"]))
        self._count_cuts(frame)
        self._look_up_limits(frame)
        for rule in self.rules_per_frame:
            self.found.extend(f for f in rule(frame, self) if f.code in self.codes)
        own = frame.own_by_request()
        ends = np.r_[cols["request"][own[1:]] != cols["request"][own[:-1]], True]
        self.last_status[cols["request"][own[ends]]] = cols["sched_status"][own[ends]]
        self.last_step[cols["request"][own[ends]]] = cols["step"][own[ends]]
        # The rows of the last LOOKBACK + 1 steps the trace has (steps a pause left out do not count).
        steps = np.unique(cols["step"][-min(len(cols["step"]), 1 << 16) :])
        keep = int(
            np.searchsorted(cols["step"], min(steps[-(LOOKBACK + 1) :][0], cols["step"][-1] - LOOKBACK), side="left")
        )
        self.context = {name: values[keep:].copy() for name, values in cols.items()}

    def _note_crash_inputs(self, batch: pa.Table | pa.RecordBatch) -> None:
        """The crash step's rows (read from the batch as fed: each row once, and only that step's
        draft ids are looked at) whose fed draft ids no embedding row holds, in row order."""
        at = pc.equal(batch.column("step"), self.crash_step)
        if not pc.any(at).as_py():
            return
        vocab = self.config.vocab_size
        for row in batch.filter(at).select(["request_id", "worker_draft_ids"]).to_pylist():
            if any(t < 0 or (vocab and t >= vocab) for t in row["worker_draft_ids"] or ()):
                self.crash_inputs.append(row["request_id"])

    def _note_sampled(self, batch: pa.Table | pa.RecordBatch) -> None:
        """Each row's sampled tokens at their positions, by output index (position minus the
        prompt): an SGLang row writes positions P .. P + n - 1, the last d of them drafts, and its
        sampled ids are the tokens at P + n - d, P + n - d + 1, ... (families/sglang/outcomes.py).
        A later row's token at a position replaces an earlier one's (a re-prefill after a retraction).
        Kept per turn: by the row's prompt length."""
        sampled = batch.column("worker_sampled_ids")
        rows = batch.filter(pc.fill_null(pc.greater(pc.list_value_length(sampled), 0), False))
        if not rows.num_rows:
            return
        by_request = self.sampled
        assert by_request is not None
        for rid, prompt, first, n, d, tokens in zip(*(rows.column(name).to_pylist() for name in SAMPLED_COLUMNS)):
            if first is None or n is None or prompt is None:
                continue  # where its tokens sit is not recorded
            start = first + n - (d or 0) - prompt
            outputs = by_request.setdefault(rid, {}).setdefault(prompt, {})
            for j, token in enumerate(tokens):
                outputs[start + j] = token

    def _count_cuts(self, frame: Frame) -> None:
        """Each own row's `cuts`: how many cuts (a preemption, a cache reset, a turn's end) its
        request life has had up to and including its step, carried across frames. An output is
        stale exactly when the cuts at its apply step are more than at the step it was scheduled in."""
        c = frame.c
        own = frame.own_by_request()
        if not len(own):
            return
        reqs = c["request"][own]
        event = c["sched_event"][own]
        is_cut = (c["sched_preempted"][own] | (event == RESET_PREEMPT) | (event == STREAM_TURN)).astype(np.int64)
        starts = np.r_[True, reqs[1:] != reqs[:-1]]
        total = np.cumsum(is_cut)
        first = np.flatnonzero(starts)
        before_group = (total[first] - is_cut[first])[np.cumsum(starts) - 1]
        c["cuts"][own] = self.cuts[reqs] + total - before_group
        ends = np.r_[starts[1:], True]
        self.cuts[reqs[ends]] = c["cuts"][own][ends]

    def _look_up_limits(self, frame: Frame) -> None:
        """Each own row's `max_tokens`: its life's limit for the turn the row is in (-1: not
        known). A streaming session's next turn starts with a longer prompt (all computed so far
        plus the chunk), so the turn is the number of prompt-length changes in the life's rows so
        far, carried across frames. Example, prompt lengths 6 6 15 15 22: turns 0 0 1 1 2."""
        c = frame.c
        own = frame.own_by_request()
        if not len(own):
            return
        reqs = c["request"][own]
        prompt = c["sched_num_prompt_tokens"][own].astype(np.int64)
        starts = np.r_[True, reqs[1:] != reqs[:-1]]
        before = np.r_[-1, prompt[:-1]]
        before[starts] = self.last_prompt[reqs[starts]]
        changed = ((before >= 0) & (prompt != before)).astype(np.int64)
        total = np.cumsum(changed)
        first = np.flatnonzero(starts)
        before_group = (total[first] - changed[first])[np.cumsum(starts) - 1]
        turn = self.turns[reqs] + total - before_group
        ends = np.r_[starts[1:], True]
        self.turns[reqs[ends]] = turn[ends]
        self.last_prompt[reqs[ends]] = prompt[ends]
        # The limit of (request, turn), through one flat table of every request's turns.
        counts, offsets, flat = self._limit_table()
        known = turn < counts[reqs]
        c["max_tokens"][own] = np.where(known, flat[np.where(known, offsets[reqs] + turn, -1)], -1)

    def _limit_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`turn_limits` as (turns per request, each request's offset, the limits then -1): only
        the requests new since the last frame are added."""
        done = len(self._limit_counts)
        if done < len(self.turn_limits):
            new = self.turn_limits[done:]
            counts = np.array([len(t) for t in new], dtype=np.int64)
            base = len(self._limit_values)
            self._limit_offsets = np.concatenate([self._limit_offsets, base + np.r_[0, np.cumsum(counts)[:-1]]])
            self._limit_counts = np.concatenate([self._limit_counts, counts])
            self._limit_values = np.concatenate(
                [self._limit_values, np.array([m for t in new for m in t], dtype=np.int64)]
            )
        return self._limit_counts, self._limit_offsets, np.r_[self._limit_values, -1]

    # ------------------------------------------------------------------ for the rules
    def last_before(self, name: str, frame: Frame, event: np.ndarray, value: np.ndarray) -> np.ndarray:
        """For each own row, `value` at the latest earlier own row of its request where `event`
        holds (-1: none yet), carried across frames under `name`; the rows of the frame's context
        were seen by an earlier frame and count through the carry. Other rows: -1."""
        carried = self.carried.setdefault(name, np.full(len(self.names), -1, dtype=np.int64))
        out = np.full(frame.size, -1, dtype=np.int64)
        own = frame.own_by_request()
        if not len(own):
            return out
        reqs = frame.c["request"][own]
        pos = np.arange(len(own))
        starts = np.r_[True, reqs[1:] != reqs[:-1]]
        last = np.maximum.accumulate(np.where(event[own], pos, -1))
        before = np.r_[-1, last[:-1]]
        segment_start = np.maximum.accumulate(np.where(starts, pos, 0))
        values = value[own].astype(np.int64)
        out[own] = np.where(before >= segment_start, values[np.maximum(before, 0)], carried[reqs])
        ends = np.r_[starts[1:], True]
        settled = ends & (last >= segment_start)
        carried[reqs[settled]] = values[last[settled]]
        return out

    def first_per_request(self, code: str, frame: Frame, violated: np.ndarray) -> np.ndarray:
        """Rows where `code` fires for the first time for their request (one finding per request)."""
        rows = np.flatnonzero(violated & frame.own)
        if not len(rows):
            return rows
        fired = self.fired.setdefault(code, np.zeros(len(self.names), dtype=bool))
        reqs = frame.c["request"][rows]
        _, first = np.unique(reqs, return_index=True)
        rows = rows[first]
        rows = rows[~fired[frame.c["request"][rows]]]
        fired[frame.c["request"][rows]] = True
        return np.sort(rows)

    def finding(
        self, frame: Frame, code: str, i: int, field: str, expected: Any, actual: Any, **detail: Any
    ) -> Finding:
        """A finding at row `i` of the frame (its step, request and life)."""
        c = frame.c
        return catalogue.BY_CODE[code].finding(
            int(c["step"][i]), self.names[c["request"][i]], int(c["sched_life"][i]), field, expected, actual, **detail
        )

    def step_finding(self, code: str, step: int, field: str, expected: Any, actual: Any, **detail: Any) -> Finding:
        """A finding about a whole step (no request)."""
        return catalogue.BY_CODE[code].finding(step, None, None, field, expected, actual, **detail)

    def run_finding(
        self, code: str, step: int, request_id: str | None, field: str, expected: Any, actual: Any, **detail: Any
    ) -> Finding:
        """A finding about the run (its outcome), naming a request by id: its latest life."""
        return catalogue.BY_CODE[code].finding(
            step, request_id, self.latest_life(request_id), field, expected, actual, **detail
        )

    def latest_life(self, request_id: str | None) -> int | None:
        """The highest life of `request_id` the trace has (None: no row has that id)."""
        lives = [life for (name, life) in self.ids if name == request_id]
        return max(lives) if lives else None

    def last_step_of(self, request_id: str) -> int:
        """The step of the last row of `request_id`'s latest life; where no row has that id, the
        run's last step (the outcome's, 0 if none): where a finding about the run is dated."""
        life = self.latest_life(request_id)
        code = self.ids.get((request_id, life)) if life is not None else None
        return int(self.outcome.step or 0) if code is None else int(self.last_step[code])

    def unfinished(self) -> list[str]:
        """The ids of the requests whose last row is not finished, sorted (one per unfinished life)."""
        return sorted(self.names[r] for r in np.flatnonzero(self.last_status != FINISHED))
