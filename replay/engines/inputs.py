"""The input driver: what reaches the engine, and when, from a workload.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. One place says which inputs land at which step, for every engine:
arrivals (each submission of an id is a new life), aborts (a request's `abort_step`, or an
`[[events]]` abort after a schedule: they land before the oldest batch is applied), and the control
events taken with the input queue before a step's `schedule()` (vLLM's EngineCoreProc), handed out
as typed values (engines/events.py) that each engine applies through `apply_control`. Streaming
sessions: each `stream_append` sends the session's next input chunk (same id, resumable), and after
the last one the end of the stream (AsyncLLM's final one-token request). A replay of a recording
also steps where the recorded engine scheduled with nothing unfinished (the oracle's
`announce_steps`, see families/vllm/recorded_inputs.py).

A conversation's next turn (a request that `follows` another with `after_finish = N`) arrives N
steps after the step in which the request it follows finished: a client sends the next turn once
it has the answer. Every engine tells the driver what it saw end, the same way (`notice_ends`,
with the number of the step whose iteration it ended in, and what ended asked of the engine's
own state: the scheduler's requests, or a live engine's front end); the driver then schedules
the turn as an ordinary arrival. A life that ends by an abort or a refusal counts too: the
client has its last answer. A turn whose request never ends never arrives.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from specreplay.replay.engines.events import ControlEvent, Resubmit, control_event
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import RequestSpec, Workload


class InputDriver:
    """The workload's inputs, step by step; `pop_*` hand out what is due."""

    def __init__(self, workload: Workload, oracle: Oracle) -> None:
        self.workload = workload
        self.oracle = oracle
        self.arrivals: dict[int, list[RequestSpec]] = defaultdict(list)
        # followed request -> the turns that arrive after it finished (`after_finish`)
        self.after: dict[str, list[RequestSpec]] = defaultdict(list)
        for spec in workload.requests:
            if spec.after_finish is not None and spec.follows is not None:
                self.after[spec.follows].append(spec)
            else:
                self.arrivals[spec.arrival_step].append(spec)
        self.aborts = sorted(
            [(s.abort_step, s.request_id) for s in workload.requests if s.abort_step]
            + [(e.step, e.request) for e in workload.events if e.when == "after"]
        )
        # step -> the control events before its schedule(), typed (engines/events.py)
        self.events: dict[int, list[ControlEvent]] = defaultdict(list)
        for record in workload.events:
            if record.when == "before":
                self.events[record.step].append(control_event(record))
        self.order = {spec.request_id: i for i, spec in enumerate(workload.requests)}  # the row order
        self.spec_of = {spec.request_id: spec for spec in workload.requests}
        self.lives: dict[str, int] = {}  # request id -> submissions so far
        self.sent: set[str] = set()  # request ids the engine was given (or refused)
        self.turns_sent: dict[str, int] = {}  # streaming request -> input chunks sent after its prompt
        self.appends_left = {rid: len(inputs) - 1 for rid, inputs in oracle.inputs.items()}
        # Per request, each life's max_tokens: its own, then each resubmit's (a recorded client
        # may ask another), in the order the engine takes them.
        self.max_tokens_of_life = {spec.request_id: [spec.max_tokens] for spec in workload.requests}
        for event in sorted(map(control_event, workload.events), key=lambda e: e.step):
            if isinstance(event, Resubmit):
                spec = self.spec_of[event.request]
                self.max_tokens_of_life[spec.request_id].append(event.max_tokens or spec.max_tokens)
        # A synthetic oracle has none: its run steps when its scheduler has requests.
        self.announce_steps = frozenset(oracle.announce_steps)

    def notice_ends(self, step: int, ended: Callable[[str], bool]) -> None:
        """The engine, after step `step`'s iteration (or during it, for what landed before its
        schedule()): `ended(rid)` says whether the request's life is over. The turns waiting for
        a request sent to the engine that ended arrive `after_finish` steps later, with the
        arrivals of that step, in the workload's order. Called again, it changes nothing."""
        for rid in [r for r in self.after if r in self.sent and ended(r)]:
            for spec in self.after.pop(rid):
                due = self.arrivals[step + (spec.after_finish or 1)]
                due.append(spec)
                due.sort(key=lambda s: self.order[s.request_id])

    def refused(self, spec: RequestSpec) -> None:
        """The engine refused this submission (vLLM 0.33 paused: engine_paused): the client has
        its answer, so a turn that follows it is sent."""
        self.sent.add(spec.request_id)

    def pop_arrivals(self, step: int) -> list[RequestSpec]:
        """Requests arriving with the input queue before step `step`'s schedule()."""
        return self.arrivals.pop(step, [])

    def pop_events(self, step: int) -> list[ControlEvent]:
        return self.events.pop(step, [])

    def pop_aborts(self, step: int) -> list[str]:
        """Aborts due by step `step` (after its schedule), not applied yet."""
        due = []
        while self.aborts and self.aborts[0][0] <= step:
            due.append(self.aborts.pop(0)[1])
        return due

    def next_input_step(self, step: int) -> int | None:
        """With the engine idle after step `step`: the step before which the next input lands
        (arrivals and events before their step's schedule(), aborts after it), or None."""
        pending = [s - 1 for s in (*self.arrivals, *self.events) if s > step + 1]
        pending += [s for s, _ in self.aborts if s > step]
        pending += [s - 1 for s in self.announce_steps if s > step + 1]
        return min(pending) if pending else None

    def steps_to_announce(self, step: int) -> bool:
        """Does the recorded engine schedule step `step` with nothing unfinished? (vLLM's
        has_requests() counts finished requests until a schedule() has announced them.)"""
        return step in self.announce_steps

    def submit(self, spec: RequestSpec) -> tuple[list[int], int, int | None]:
        """A submission of `spec`: its prompt, the life's max_tokens and stop token; counts the life."""
        rid = spec.request_id
        life = self.lives[rid] = self.lives.get(rid, -1) + 1
        self.sent.add(rid)
        max_tokens = self.max_tokens_of_life[rid]
        return self.oracle.prompt(rid), max_tokens[min(life, len(max_tokens) - 1)], self.oracle.stop_token(rid)

    def ends_at_once(self, spec: RequestSpec) -> bool:
        """A streaming request with no chunk to come: its stream ends right after the prompt."""
        return spec.streaming and not self.appends_left.get(spec.request_id)

    def drop_chunk(self, rid: str) -> None:
        """The session ended (aborted): its client stops streaming; the chunk is not sent."""
        self.appends_left[rid] -= 1

    def next_chunk(self, rid: str) -> tuple[list[int], int, bool]:
        """A streaming session's next input chunk: (tokens, max_tokens, last chunk?)."""
        self.appends_left[rid] -= 1
        turn = self.turns_sent[rid] = self.turns_sent.get(rid, 0) + 1
        _, max_tokens = self.oracle.inputs[rid][turn]
        return self.oracle.chunk(rid, turn), max_tokens, not self.appends_left[rid]
