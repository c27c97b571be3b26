"""SGLang's streaming sessions, driven as a streaming client drives them.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli, the SGLang driver's inputs (families/sglang/loop.py). A workload's
streaming request (`streaming = true`, fed by `stream_append` events) is, on SGLang 0.5.23, a
streaming session (`--enable-streaming-session`): the client opens it (`OpenSessionReqInput`,
streaming, the request's id as the session id), sends each turn as an ordinary generate request
naming the session (`session_params.id`), and closes it (`CloseSessionReqInput`) after its last
turn. Each turn is a new `Req` under the request's id (a client may reuse an id once its request
finished), built by SGLang's `Session.create_req` on the turn before it: its prompt is the turn
before's prompt and every output it kept (`output_ids[:max_new_tokens]`, the last sampled token
included: SGLang's contract, where vLLM's discards it) then the chunk, and it borrows the
session's KV record, so only the tail is prefilled.

SGLang's streaming session takes one turn at a time: a turn sent while one runs is refused with an
abort ("Streaming session already has an active request"). So the client holds a chunk that
arrives mid-turn until the turn's last output reached it (as vLLM's engine holds it for the turn's
end), and sends it with the next iteration's inputs. A turn that ends aborted ends the session
(vLLM's: an aborted streaming request is over): the chunks still to come are dropped, and the
session closed. Everything the client knows it learns from what the scheduler sends it (the
finish reasons in its outputs), never from the scheduler's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specreplay.replay.engines.inputs import InputDriver

#: The turn request builder the receiver lends: (request id, prompt, max_tokens) -> the
#: TokenizedGenerateReqInput (the client names its session on it).
TurnBuilder = Callable[[str, list[int], int], Any]


class SessionClient:
    """The streaming sessions of one run, from the client's side (module docstring)."""

    def __init__(self, inputs: InputDriver, turn: TurnBuilder) -> None:
        self.inputs = inputs
        self.turn = turn
        self.open: set[str] = set()  # sessions opened and not closed yet
        self.running: set[str] = set()  # sessions with a turn sent whose last output has not come back
        self.held: dict[str, int] = {}  # session -> chunks arrived and not sent yet
        self.ended: set[str] = set()  # sessions whose stream is over (last turn sent, or aborted)

    @property
    def active(self) -> bool:
        """Is a session still open (the run is not over while one is)?"""
        return bool(self.open)

    def first_turn(self, spec: Any, request: Any) -> list[Any]:
        """A streaming request's arrival: open its session, then send its prompt as the first turn."""
        from sglang.srt.managers.io_struct import OpenSessionReqInput, SessionParams

        rid = spec.request_id
        request.session_params = SessionParams(id=rid)
        self.open.add(rid)
        self.running.add(rid)
        if self.inputs.ends_at_once(spec):
            self.ended.add(rid)
        return [OpenSessionReqInput(capacity_of_str_len=0, session_id=rid, streaming=True), request]

    def chunk_arrived(self, rid: str) -> None:
        """A `stream_append` for session `rid` reached the client."""
        if rid in self.ended:
            self.inputs.drop_chunk(rid)  # aborted: the client stopped streaming
        else:
            self.held[rid] = self.held.get(rid, 0) + 1

    def aborted(self, rid: str) -> None:
        """The client aborts session `rid` (an abort of the request): no turn after this one."""
        if rid in self.open:
            self.end(rid)

    def answered(self, rid: str, reason: Any) -> None:
        """The scheduler sent request `rid` its finish (`reason`, SGLang's finish-reason dict)."""
        if rid not in self.running:
            return
        self.running.discard(rid)
        if isinstance(reason, dict) and reason.get("type") == "abort":
            self.end(rid)

    def end(self, rid: str) -> None:
        """No more turns for `rid`: the chunks held and to come are dropped."""
        self.ended.add(rid)
        for _ in range(self.held.pop(rid, 0)):
            self.inputs.drop_chunk(rid)

    def due(self) -> list[Any]:
        """What the client sends with this iteration's inputs: each idle session's next turn
        (its oldest chunk held), and the close of each session whose stream is over."""
        from sglang.srt.managers.io_struct import CloseSessionReqInput, SessionParams

        out: list[Any] = []
        for rid in sorted(self.open - self.running):
            if self.held.get(rid):
                self.held[rid] -= 1
                tokens, max_tokens, last = self.inputs.next_chunk(rid)
                request = self.turn(rid, tokens, max_tokens)
                request.session_params = SessionParams(id=rid)
                out.append(request)
                self.running.add(rid)
                if last:
                    self.ended.add(rid)
            elif rid in self.ended:
                out.append(CloseSessionReqInput(session_id=rid))
                self.open.discard(rid)
        return out


__all__ = ["SessionClient", "TurnBuilder"]
