"""Ground truth of a workload: every request's expected token sequence and its drafter's proposals.

Where it sits: replay. The runner's drafter and KV truth, the engine's token check and the
scheduler's prompts all come from here, so one workload gives the same tokens whatever
implementation or schedule runs it.
"""

from __future__ import annotations

from specreplay.replay import model
from specreplay.replay.workload import RequestSpec, Workload


class Oracle:
    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.vocab = workload.config.vocab_size
        self.specs: dict[str, RequestSpec] = {spec.request_id: spec for spec in workload.requests}
        self._hash = {rid: model.request_hash(workload.seed, rid) for rid in self.specs}
        self._expected: dict[str, list[int]] = {}
        self._acceptance = {rid: workload.acceptance_for(spec) for rid, spec in self.specs.items()}

    def hash(self, rid: str) -> int:
        return self._hash[rid]

    def prompt(self, rid: str) -> list[int]:
        spec = self.specs[rid]
        return model.prompt_tokens(self.workload.seed, rid, spec.prompt_len, self.vocab)

    def expected(self, rid: str) -> list[int]:
        """Prompt then true outputs, long enough for any position a run can reach."""
        seq = self._expected.get(rid)
        if seq is None:
            extra = 2 * self.workload.config.num_spec_tokens + 2
            seq = model.expected_tokens(self.workload.seed, self.specs[rid], self.vocab, extra)
            self._expected[rid] = seq
        return seq

    def token_at(self, rid: str, position: int) -> int:
        seq = self.expected(rid)
        h = self._hash[rid]
        while len(seq) <= position:
            seq.append(model.next_token(h, len(seq) - 1, seq[-1], self.vocab))
        return seq[position]

    def stop_token(self, rid: str) -> int | None:
        """The stop token id of a request with `stop_at = N`: its expected N-th output token. Like
        vLLM's stop_token_ids, the request stops at the first output equal to it (which can come
        before the N-th output when that token id also occurs earlier)."""
        spec = self.specs[rid]
        if spec.stop_at is None:
            return None
        return self.token_at(rid, spec.prompt_len + spec.stop_at - 1)

    def drafts(self, rid: str, first_position: int, k: int) -> list[int]:
        kind, p = self._acceptance[rid]
        out = []
        for q in range(first_position, first_position + k):
            true = self.token_at(rid, q)
            correct = model.draft_is_correct(kind, p, self.workload.seed, rid, q)
            out.append(true if correct else (true + 1) % self.vocab)
        return out

    def mismatches(self, rid: str, first_output_index: int, tokens: tuple[int, ...] | list[int]) -> int:
        """How many of `tokens`, appended as outputs starting at `first_output_index`, differ
        from the expected outputs."""
        base = self.specs[rid].prompt_len + first_output_index
        return sum(1 for j, t in enumerate(tokens) if t != self.token_at(rid, base + j))
