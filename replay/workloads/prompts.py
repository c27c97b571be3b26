"""Prompts: the token ids each request of a workload sends, resolved once.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. The oracle hands these prompts to every engine (through the input
driver) and builds its expected sequences on them; the workload checks its lengths against the
engine's limits with them. Nothing else makes up a prompt.

A request's prompt is its own text after what comes before it:

- its own text: `prompt = [ids]` as given, else `prompt_len` seeded tokens (the seed and its id
  pick them, as they always did);
- a shared prefix (`prefix = "NAME"`): the workload's `[prefixes]` entry NAME first, given as ids
  or as a count of seeded tokens. Requests naming one prefix share its tokens, block for block,
  which is what vLLM's automatic prefix caching finds;
- a conversation's next turn (`follows = "ID"`): request ID's whole prompt, then the outputs a
  correct engine gives it (its expected tokens: max_tokens of them, or up to and including the
  first equal to its stop token, as vLLM's stop_token_ids end it), then its own text. A client
  sends the previous turn's answer back as part of the next prompt; so the follow-up shares
  all of ID's prompt and its answer's full blocks.

The expected outputs are the target model's rule (tokens.next_token, per request), so the whole
conversation is fixed by the workload, whatever any engine runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specreplay.replay.workloads import tokens
from specreplay.replay.workloads.request_spec import RequestSpec

if TYPE_CHECKING:
    from specreplay.replay.workloads.workload import Workload


class Prompts:
    """Every request's prompt, by id (the workload's references are checked before: a prefix it
    names exists, a request it follows is listed before it). Built on demand: a workload of many
    long prompts keeps none of them here but the answers its turns repeat."""

    def __init__(self, workload: Workload) -> None:
        self._seed, self._vocab = workload.seed, workload.config.vocab_size
        self._specs = {spec.request_id: spec for spec in workload.requests}
        self._prefixes = {p.name: p for p in workload.prefixes}
        self._lengths: dict[str, int] = {}
        self._answers: dict[str, list[int]] = {}  # a followed request's answer, by its id

    def of(self, request_id: str) -> list[int]:
        """The prompt of `request_id` (a fresh list)."""
        chain = self._chain(request_id)
        root = self._specs[chain[0]]
        prompt = (self.prefix(root.prefix) if root.prefix is not None else []) + self._own(root)
        for before, rid in zip(chain, chain[1:]):  # each turn: the one before, its answer, its text
            prompt.extend(self._answer(before))
            prompt.extend(self._own(self._specs[rid]))
        return prompt

    def length(self, request_id: str) -> int:
        """The prompt's length, its tokens made only where a stop token cuts an answer short."""
        pending, rid = [], request_id
        while rid not in self._lengths:  # back through the turns whose length is not known yet
            pending.append(rid)
            rid = self._specs[rid].follows
            if rid is None:
                break
        for rid in reversed(pending):  # then forward: each turn adds to the one before
            spec = self._specs[rid]
            known = spec.prompt_len
            if spec.prefix is not None:
                known += self._prefixes[spec.prefix].length
            elif spec.follows is not None:
                before = self._specs[spec.follows]
                said = before.max_tokens if before.stop_at is None else len(self._answer(before.request_id))
                known += self._lengths[before.request_id] + said
            self._lengths[rid] = known
        return self._lengths[request_id]

    def prefix(self, name: str) -> list[int]:
        """The token ids of the workload's prefix `name`."""
        p = self._prefixes[name]
        return (
            list(p.ids)
            if p.ids is not None
            else tokens.prompt_tokens(self._seed, f"prefix/{name}", p.length, self._vocab)
        )

    def _chain(self, request_id: str) -> list[str]:
        """The conversation up to `request_id`, its first turn first (a walk, not a recursion:
        a conversation may have many turns)."""
        chain = [request_id]
        while (before := self._specs[chain[-1]].follows) is not None:
            chain.append(before)
        return chain[::-1]

    def _own(self, spec: RequestSpec) -> list[int]:
        """Its own text: the ids given, or prompt_len seeded tokens (the seed and its id pick them).
        A request sent as embeddings (`input_embeds`) has them too: each embedding row stands for
        its token (the SGLang driver encodes it in the row; the engine sees placeholder ids)."""
        if spec.prompt is not None:
            return list(spec.prompt)
        return tokens.prompt_tokens(self._seed, spec.request_id, spec.prompt_len, self._vocab)

    def _answer(self, request_id: str) -> list[int]:
        """Its answer, from the last token of its prompt (its own text's) and that position."""
        said = self._answers.get(request_id)
        if said is None:
            spec = self._specs[request_id]
            last = self._own(spec)[-1]
            said = answer_after(spec, last, self.length(request_id) - 1, self._seed, self._vocab)
            self._answers[request_id] = said
        return said


def answer(spec: RequestSpec, prompt: tuple[int, ...] | list[int], seed: int, vocab: int) -> list[int]:
    """The outputs a correct engine gives `spec` on `prompt`: its expected tokens, max_tokens of
    them, cut after the first equal to its stop token (the expected stop_at-th output, which can
    occur earlier: vLLM's stop_token_ids stop at the first)."""
    return answer_after(spec, prompt[-1], len(prompt) - 1, seed, vocab)


def answer_after(spec: RequestSpec, last: int, position: int, seed: int, vocab: int) -> list[int]:
    """`answer` from the prompt's last token and its position: all the model's rule reads."""
    h = tokens.request_hash(seed, spec.request_id)
    said = tokens.continue_tokens(h, [last], 1 + max(spec.max_tokens, spec.stop_at or 0), vocab, position)
    outputs = said[1 : 1 + spec.max_tokens]
    if spec.stop_at is not None:
        stop = said[spec.stop_at]
        if stop in outputs:
            outputs = outputs[: outputs.index(stop) + 1]
    return outputs


__all__ = ["Prompts", "answer", "answer_after"]
