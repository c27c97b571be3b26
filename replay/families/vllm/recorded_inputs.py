"""The recorded inputs of an attached run, as the prompts, chunks and stops an oracle hands the input driver.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. A recording of a user's own vLLM (`SPECREPLAY_RECORD`, merged by
workflows/merge.py) keeps what went into its scheduler in the trace's `inputs` metadata
(observers/input_observer.py writes it): per request life the prompt token ids and the sampling
parameters that end it, per streaming session each input chunk. The trace's workload only summarises
them (lengths and steps: merge.py `workload_of`); its seeded prompts are not the ones the recorded
engine saw. `RecordedOracle` (recorded_oracle.py) takes the prompts, chunks and stop tokens from
here instead, so a replay feeds its engine what the recorded one was fed.

The stop condition. vLLM ends a life at its first output token in its stop set: the EOS token
unless `ignore_eos`, then `stop_token_ids` (`check_stop`, vllm/v1/core/sched/utils.py;
`min_tokens` only masks them in the sampler, so no recorded output holds one too early). The
reference `Request`, and the real scheduler as a replay builds it, take one stop token. On the
recorded outputs one is exact: the token the life stopped on is the only member of its stop set
its outputs reach. Three steps: stop set {2 (EOS), 9}, outputs 5 7 2 -> the life stopped on 2;
a replay given the stop token 2 emits 5, 7 (neither is 2), then 2 and stops there too. A life
that never stopped reached no member: any one of them is as exact, the first stop_token_ids
entry (None without one). The EOS id itself is not recorded: a "stop" on a token outside
stop_token_ids, with ignore_eos false, was EOS.

What the summary cannot hold stays exact here or is refused in one line: a life whose prompt or
stop token ids differ from the id's first life would need outcomes per life (recorded_oracle.py keys
them per request and turn), so it is refused; per-life max_tokens ride on the workload's
resubmit events (merge.py). A workload that no longer matches the recording (a shrunk
candidate: a prompt or chunk of another length) gets the synthetic input where lengths differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specreplay.traces.errors import InputError

#: The columns the stop tokens and the announcing steps are read from.
COLUMNS = (
    "step",
    "request_id",
    "sched_status",
    "sched_num_scheduled_tokens",
    "sched_finished_announced",
    "apply_outcome",
    "apply_life",
    "apply_num_tokens",
    "apply_finish_reason",
    "apply_sampled_token_ids",
)


@dataclass(frozen=True)
class Life:
    """One submission of a request id, as the recorded scheduler received it."""

    step: int  # the engine step it arrived before
    prompt: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool


class RecordedInputs:
    """Per request: its lives, its streaming chunks and the stop token a replay gives it; and the
    steps the recorded engine scheduled only to announce finished requests."""

    def __init__(
        self,
        lives: dict[str, list[Life]],
        chunks: dict[str, list[tuple[int, ...]]],
        stops: dict[str, int | None],
        announce_steps: frozenset[int],
    ) -> None:
        self.lives = lives
        self.chunks = chunks  # request -> input chunks after its prompt, in order (the end of a stream left out)
        self.stops = stops
        # Steps whose schedule() had no unfinished request: vLLM's has_requests() counts finished
        # requests not yet announced (SchedulerInterface.has_requests), so its engine core steps
        # once more to send their ids to the workers; the reference's has_requests(), as vLLM's
        # get_num_unfinished_requests(), does not. The input driver makes the replay step there.
        self.announce_steps = announce_steps

    @classmethod
    def of(cls, inputs: dict[str, Any], table: Any, where: str = "recorded inputs") -> RecordedInputs:
        """Read a trace's `inputs` metadata and its rows; InputError (one line) on what does not fit."""
        if not isinstance(inputs, dict) or not isinstance(inputs.get("requests"), list):
            raise InputError(f"{where}: expected an object with a list of requests (the trace's specreplay.inputs)")
        lives: dict[str, list[Life]] = {}
        for i, raw in enumerate(inputs["requests"]):
            rid, life = _life(raw, f"{where}: requests[{i}]")
            lives.setdefault(rid, []).append(life)
            first = lives[rid][0]
            if (life.prompt, life.stop_token_ids, life.ignore_eos) != (
                first.prompt,
                first.stop_token_ids,
                first.ignore_eos,
            ):
                raise InputError(
                    f"{where}: request {rid!r} was resubmitted at step {life.step} with another prompt or stop "
                    "condition than its first life; a replay keeps outcomes per request, not per life, so it "
                    "cannot replay this yet (replay with --oracle synthetic)"
                )
        chunks: dict[str, list[tuple[int, ...]]] = {}
        for i, raw in enumerate(inputs.get("chunks") or []):
            rid, prompt = _chunk(raw, f"{where}: chunks[{i}]")
            # The end of a stream (AsyncLLM's final non-resumable [0] request) is no input chunk.
            if prompt and not raw.get("end") and rid in lives:
                chunks.setdefault(rid, []).append(prompt)
        cols = {name: table.column(name).to_pylist() if name in table.column_names else None for name in COLUMNS}
        missing = [name for name, col in cols.items() if col is None]
        if missing:
            raise InputError(f"{where}: the trace has no {missing[0]} column (schema v3 recordings carry it)")
        stops = _stops(lives, cols, where)
        return cls(lives, chunks, stops, _announce_steps(cols))

    # ------------------------------------------------------------------ what the oracle hands out
    def prompt(self, rid: str, length: int) -> list[int] | None:
        """The recorded prompt of `rid`, if it has `length` tokens (the workload's prompt_len)."""
        lives = self.lives.get(rid)
        if not lives or len(lives[0].prompt) != length:
            return None
        return list(lives[0].prompt)

    def chunk(self, rid: str, turn: int, length: int) -> list[int] | None:
        """The recorded input chunk starting turn `turn` (>= 1), if it has `length` tokens."""
        chunks = self.chunks.get(rid, [])
        if turn > len(chunks) or len(chunks[turn - 1]) != length:
            return None
        return list(chunks[turn - 1])

    def stop_token(self, rid: str) -> int | None:
        return self.stops.get(rid)


def _life(raw: Any, where: str) -> tuple[str, Life]:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected an object")
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        raise InputError(f"{where}: id must be a non-empty string, got {rid!r}")
    life = Life(
        step=_int(raw.get("step"), f"{where}: step"),
        prompt=_tokens(raw.get("prompt"), f"{where}: prompt"),
        max_tokens=_int(raw.get("max_tokens"), f"{where}: max_tokens"),
        stop_token_ids=_tokens(raw.get("stop_token_ids", []), f"{where}: stop_token_ids"),
        ignore_eos=raw.get("ignore_eos", False),
    )
    if not isinstance(life.ignore_eos, bool):
        raise InputError(f"{where}: ignore_eos must be true or false, got {life.ignore_eos!r}")
    return rid, life


def _chunk(raw: Any, where: str) -> tuple[str, tuple[int, ...]]:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        raise InputError(f"{where}: expected an object with a request id")
    return raw["id"], _tokens(raw.get("prompt", []), f"{where}: prompt")


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def _tokens(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in value):
        raise InputError(f"{where}: expected a list of token ids (non-negative integers)")
    return tuple(value)


def _stops(lives: dict[str, list[Life]], cols: dict[str, list], where: str) -> dict[str, int | None]:
    """Per request, the one stop token a replay gives it (see the module docstring)."""
    stopped: dict[str, int] = {}
    for i, reason in enumerate(cols["apply_finish_reason"]):
        rid = cols["request_id"][i]
        if reason != "stop" or cols["apply_outcome"][i] != "applied" or rid not in lives:
            continue
        sampled, n = cols["apply_sampled_token_ids"][i] or [], cols["apply_num_tokens"][i] or 0
        if not 0 < n <= len(sampled):
            continue  # no sampled ids on the row: recorded_oracle.py refuses such a row itself
        token, life = sampled[n - 1], lives[rid][min(cols["apply_life"][i] or 0, len(lives[rid]) - 1)]
        if token not in life.stop_token_ids and life.ignore_eos:
            raise InputError(
                f"{where}: request {rid!r} stopped at step {cols['step'][i]} on token {token}, which its recorded "
                f"sampling parameters do not stop on (stop_token_ids {list(life.stop_token_ids)}, ignore_eos)"
            )
        stopped.setdefault(rid, token)
    return {
        rid: stopped.get(rid, ls[0].stop_token_ids[0] if ls[0].stop_token_ids else None) for rid, ls in lives.items()
    }


def _announce_steps(cols: dict[str, list]) -> frozenset[int]:
    """Steps whose schedule() scheduled nothing and announced a finished request (vLLM's
    has_requests() counts finished requests not yet announced), or whose rows are all of
    finished requests; a streaming session waiting for its next chunk does not keep vLLM from it."""
    steps, unfinished, busy, announced = set(), set(), set(), set()
    for step, status, scheduled, told in zip(
        cols["step"], cols["sched_status"], cols["sched_num_scheduled_tokens"], cols["sched_finished_announced"]
    ):
        steps.add(step)
        if status != "finished":
            unfinished.add(step)
        if scheduled:
            busy.add(step)
        if told:
            announced.add(step)
    return frozenset((steps - unfinished) | (announced - busy))


__all__ = ["COLUMNS", "Life", "RecordedInputs"]
