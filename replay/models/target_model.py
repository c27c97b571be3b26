"""The tiny deterministic target model on the runner's device (torch).

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. The reference runner calls `TargetModel.forward`; the rule is
`workloads.tokens.next_token`, on tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specreplay.replay.workloads.tokens import MUL_POS, MUL_TOKEN

if TYPE_CHECKING:
    import torch


class TargetModel:
    """Embedding lookup plus the next-token rule, on the runner's device."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        import torch

        self.vocab_size = vocab_size
        # The embedding table maps id -> id, so the lookup is real (and fails on a negative id,
        # as the GPU kernel does) but carries no weights to learn.
        self.embedding = torch.arange(vocab_size, dtype=torch.int64, device=device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hashes: torch.Tensor) -> torch.Tensor:
        """Greedy next token for every input position. `input_ids` must be >= 0: the caller checks
        (a negative id on CUDA is a device-side assert that poisons the whole context)."""
        emb = self.embedding[input_ids]
        return (MUL_TOKEN * emb + MUL_POS * positions + hashes) % self.vocab_size


class RecordedTargetModel:
    """The target model of a replayed recording: each position's token is looked up in the
    recorded outcomes (`workloads.recorded_oracle.RecordedOracle.answer`), a gap filled by its rules.
    A table, not a formula: it runs on the host and hands the runner a tensor on its device."""

    def __init__(self, oracle: Any, device: torch.device) -> None:
        self.oracle = oracle
        self.device = device

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, turns: list[tuple[str, int]], counts: list[int]
    ) -> torch.Tensor:
        """`turns`: per row, (request id, prompt length); `counts`: per row, its input tokens."""
        import torch

        ids, where = input_ids.tolist(), positions.tolist()
        out: list[int] = []
        at = 0
        for (rid, prompt_len), n in zip(turns, counts):
            out.extend(self.oracle.answer(rid, prompt_len, where[at + j], ids[at + j]) for j in range(n))
            at += n
        return torch.tensor(out, dtype=torch.int64, device=self.device)
