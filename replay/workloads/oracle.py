"""Ground truth of a workload: every request's expected token sequence and its drafter's proposals.

Where it sits: replay. The runner's drafter and KV truth, the engine's token check and the
scheduler's prompts all come from here, so one workload gives the same tokens whatever
implementation or schedule runs it.

A streaming session has one expected sequence per turn: turn t + 1 starts from turn t's
sequence cut after its prompt and all but its last output (what vLLM keeps), then the chunk of
input tokens the turn appends. Callers name the turn by its prompt length (they grow strictly).
"""

from __future__ import annotations

from specreplay.replay.workloads import tokens
from specreplay.replay.workloads.workload import RequestSpec, Workload


class Oracle:
    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.vocab = workload.config.vocab_size
        self.specs: dict[str, RequestSpec] = {spec.request_id: spec for spec in workload.requests}
        self._hash = {rid: tokens.request_hash(workload.seed, rid) for rid in self.specs}
        self._expected: dict[tuple[str, int], list[int]] = {}  # (request, turn) -> sequence
        self._acceptance = {rid: workload.acceptance_for(spec) for rid, spec in self.specs.items()}
        #: Per streaming request: each turn's input (tokens, max_tokens), in the order they arrive.
        self.inputs: dict[str, list[tuple[int, int]]] = {}
        # Per streaming request: each turn's (prompt length, max_tokens); the turn by prompt length.
        self._turns: dict[str, list[tuple[int, int]]] = {}
        self._turn_of: dict[str, dict[int, int]] = {}
        for rid, spec in self.specs.items():
            if not spec.streaming:
                continue
            self.inputs[rid] = workload.turns(spec)
            lengths, prompt_len = [], 0
            for t, (length, max_tokens) in enumerate(self.inputs[rid]):
                prompt_len = length if t == 0 else prompt_len + lengths[-1][1] - 1 + length
                lengths.append((prompt_len, max_tokens))
            self._turns[rid] = lengths
            self._turn_of[rid] = {length: t for t, (length, _) in enumerate(lengths)}

    def hash(self, rid: str) -> int:
        return self._hash[rid]

    def prompt(self, rid: str) -> list[int]:
        spec = self.specs[rid]
        return tokens.prompt_tokens(self.workload.seed, rid, spec.prompt_len, self.vocab)

    def turn(self, rid: str, prompt_len: int | None) -> int:
        """The turn of a request whose current prompt has `prompt_len` tokens (None: the first)."""
        if prompt_len is None or rid not in self._turn_of:
            return 0
        return self._turn_of[rid].get(prompt_len, 0)

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
                seq = tokens.expected_tokens(self.workload.seed, self.specs[rid], self.vocab, extra)
            else:
                before_len, before_max = self._turns[rid][turn - 1]
                keep = before_len + before_max - 1
                seq = self.expected(rid, before_len)
                seq = seq[:keep] + self.chunk(rid, turn)
                prompt_len, max_tokens = self._turns[rid][turn]
                h = self._hash[rid]
                while len(seq) < prompt_len + max_tokens + extra:
                    seq.append(tokens.next_token(h, len(seq) - 1, seq[-1], self.vocab))
            self._expected[(rid, turn)] = seq
        return seq

    def token_at(self, rid: str, position: int, prompt_len: int | None = None) -> int:
        seq = self.expected(rid, prompt_len)
        h = self._hash[rid]
        while len(seq) <= position:
            seq.append(tokens.next_token(h, len(seq) - 1, seq[-1], self.vocab))
        return seq[position]

    def stop_token(self, rid: str) -> int | None:
        """The stop token id of a request with `stop_at = N`: its expected N-th output token. Like
        vLLM's stop_token_ids, the request stops at the first output equal to it (which can come
        before the N-th output when that token id also occurs earlier)."""
        spec = self.specs[rid]
        if spec.stop_at is None:
            return None
        return self.token_at(rid, spec.prompt_len + spec.stop_at - 1)

    def drafts(self, rid: str, first_position: int, k: int, prompt_len: int | None = None) -> list[int]:
        kind, p = self._acceptance[rid]
        out = []
        for q in range(first_position, first_position + k):
            true = self.token_at(rid, q, prompt_len)
            correct = tokens.draft_is_correct(kind, p, self.workload.seed, rid, q)
            out.append(true if correct else (true + 1) % self.vocab)
        return out

    def mismatches(
        self, rid: str, first_output_index: int, tokens: tuple[int, ...] | list[int], prompt_len: int | None = None
    ) -> int:
        """How many of `tokens`, appended as outputs starting at `first_output_index` (of the
        turn whose prompt has `prompt_len` tokens), differ from the expected outputs."""
        base = (self.specs[rid].prompt_len if prompt_len is None else prompt_len) + first_output_index
        return sum(1 for j, t in enumerate(tokens) if t != self.token_at(rid, base + j, prompt_len))
