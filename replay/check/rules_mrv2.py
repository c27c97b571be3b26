"""Model Runner V2's invariants: the device count against the scheduler's, the CPU mirror, where
each verified draft came from, a preempted request's next life, one request per slot, the
positions a step runs at.

Codes: M1 (two codes: the device count before the step and its advance after post_update), M2,
M3, M4, M5, M6 (the step's positions start at the device count); they run on MRV2 traces only
(`trace.impl.runner_family == "v2"`), over the columns its observer fills
(replay/families/vllm/mrv2/observer.py; schema "worker (MRV2)"). The invariants are stated in
docs/reference.md section 9, from vLLM 0.32.0's vllm/v1/worker/gpu/. Vectorised over a frame's
columns (frames.py); the message texts are in the catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import APPLIED, Frame
from specreplay.replay.check.rules_counters import rejected_in_flight

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def check_device_computed(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """M1: the device num_computed_tokens the step runs from is the scheduler's C less the
    rejections of its steps in flight (INV-M1), and post_update advances it by the scheduled
    tokens less the rejections the scheduler applies for the step."""
    c = frame.c
    rejected, unknown = rejected_in_flight(frame)
    scheduled = c["sched_num_scheduled_tokens"] > 0
    before, after = c["worker_device_computed_before"], c["worker_device_computed_after"]
    computed = c["sched_num_computed_tokens"]
    settled = computed - rejected
    ran = scheduled & ~c["worker_device_computed_before_is_null"]
    for i in chk.first_per_request("M1-device-computed", frame, ran & ~unknown & (before != settled)):
        yield chk.finding(
            frame,
            "M1-device-computed",
            i,
            "num_computed_tokens",
            int(settled[i]),
            int(before[i]),
            sched_num_computed_tokens=int(computed[i]),
            rejected_in_flight=int(rejected[i]),
        )
    # The advance, where the scheduler applied the step's output (its rejections are known) and
    # the output finished nothing (a finished request's count no longer matters to anyone).
    applied = (c["apply_outcome"] == APPLIED) & ~c["apply_num_rejected_is_null"] & (c["apply_finish_reason"] <= 0)
    advance = c["sched_num_scheduled_tokens"] - c["apply_num_rejected"].astype(np.int64)
    moved = after.astype(np.int64) - before
    violated = ran & applied & ~c["worker_device_computed_after_is_null"] & (moved != advance)
    for i in chk.first_per_request("M1-device-advance", frame, violated):
        yield chk.finding(
            frame,
            "M1-device-advance",
            i,
            "num_computed_tokens",
            int(before[i] + advance[i]),
            int(after[i]),
            worker_device_computed_before=int(before[i]),
            sched_num_scheduled_tokens=int(c["sched_num_scheduled_tokens"][i]),
            apply_num_rejected=int(c["apply_num_rejected"][i]),
        )


def check_cpu_mirror(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """M2: the CPU mirror num_computed_tokens_np holds the scheduler's C once update_requests ran
    (INV-M2): the device count plus the rejections still in flight, an upper bound one step behind."""
    c = frame.c
    mirror, computed = c["worker_cpu_computed"], c["sched_num_computed_tokens"]
    violated = (c["sched_num_scheduled_tokens"] > 0) & ~c["worker_cpu_computed_is_null"] & (mirror != computed)
    for i in chk.first_per_request("M2-cpu-mirror", frame, violated):
        device = None if c["worker_device_computed_before_is_null"][i] else int(c["worker_device_computed_before"][i])
        yield chk.finding(
            frame,
            "M2-cpu-mirror",
            i,
            "num_computed_tokens_np",
            int(computed[i]),
            int(mirror[i]),
            worker_device_computed_before=device,
        )


def check_positions_from_device(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """M6: a step's input positions for a request start at the device count it runs from
    (INV-M6): `worker_first_position` = `worker_device_computed_before`. Both are the worker's own
    recorded inputs, so the rule needs no ground truth and no forced tokens: an attached recording
    of a real deployment holds the evidence as a forced run does."""
    c = frame.c
    position, device = c["worker_first_position"], c["worker_device_computed_before"]
    ran = (
        (c["sched_num_scheduled_tokens"] > 0)
        & ~c["worker_first_position_is_null"]
        & ~c["worker_device_computed_before_is_null"]
    )
    for i in chk.first_per_request("M6-position-device-count", frame, ran & (position != device)):
        mirror = None if c["worker_cpu_computed_is_null"][i] else int(c["worker_cpu_computed"][i])
        yield chk.finding(
            frame,
            "M6-position-device-count",
            i,
            "positions",
            int(device[i]),
            int(position[i]),
            worker_cpu_computed=mirror,
            sched_num_computed_tokens=int(c["sched_num_computed_tokens"][i]),
        )


#: M3's reasons, in the order they are told apart.
PADDING, OTHER_REQUEST, NOT_LAST_STEP, MOVED_PAST = "padding", "other_request", "not_last_step", "moved_past"


def check_draft_origin(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """M3: every draft a step verifies was proposed for the same request, by its last step in the
    worker's batch, at the position it still is at (INV-M3); otherwise the slots verify padding
    (nothing proposed since it took its slot), another request's drafts, drafts of an older
    step, or drafts of a position the request has moved past."""
    c = frame.c
    step = c["step"]
    ran = ~c["worker_slot_is_null"]
    last = chk.last_before("M3-last-worker-step", frame, ran, step)
    proposed = c["worker_draft_proposed_step"]
    padding = c["worker_draft_proposed_step_is_null"]
    other = ~padding & c["worker_draft_for_other"]
    older = ~padding & ~other & (proposed != last)
    moved = (
        ~padding
        & ~other
        & ~older
        & ~c["worker_draft_base_is_null"]
        & ~c["worker_device_computed_before_is_null"]
        & (c["worker_draft_base"] != c["worker_device_computed_before"])
    )
    verified = ran & (c["worker_num_draft_slots"] > 0)
    for i in np.flatnonzero(frame.own & verified & (padding | other | older | moved)):
        reason = PADDING if padding[i] else OTHER_REQUEST if other[i] else NOT_LAST_STEP if older[i] else MOVED_PAST
        yield chk.finding(
            frame,
            "M3-draft-origin",
            i,
            "draft_tokens",
            None,
            int(c["worker_num_draft_slots"][i]),
            reason=reason,
            last_worker_step=int(last[i]) if last[i] >= 0 else None,
            worker_draft_proposed_step=None if padding[i] else int(proposed[i]),
            worker_draft_proposed_for=c["worker_draft_proposed_for"][i],
            worker_draft_base=None if c["worker_draft_base_is_null"][i] else int(c["worker_draft_base"][i]),
            worker_device_computed_before=(
                None if c["worker_device_computed_before_is_null"][i] else int(c["worker_device_computed_before"][i])
            ),
        )


def check_preempted_as_new(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """M4: MRV2 frees a preempted request's slot like a finished one's, at the step that lists it
    preempted, and its next run arrives as a new request whose prefill is every token it has
    (prompt and outputs), INV-M4."""
    c = frame.c
    preempted = c["sched_preempted"]
    ran = ~c["worker_slot_is_null"]
    kept = preempted & (c["worker_freed_preempted"] == 0)
    # Was the request's latest event before this row (a preemption, or a step the worker ran) a preemption?
    since = chk.last_before("M4-preempted-since", frame, preempted | ran, preempted.astype(np.int64)) == 1
    tokens = c["sched_num_tokens"]
    not_new = c["worker_new_life"] != 1
    short = c["worker_prefill_len_is_null"] | (c["worker_prefill_len"] != tokens)
    back = ran & since & (not_new | short)
    for i in chk.first_per_request("M4-preempted-as-new", frame, kept | back):
        if kept[i]:
            yield chk.finding(frame, "M4-preempted-as-new", i, "worker_freed_preempted", True, False, reason="kept")
            continue
        yield chk.finding(
            frame,
            "M4-preempted-as-new",
            i,
            "worker_prefill_len",
            int(tokens[i]),
            None if c["worker_prefill_len_is_null"][i] else int(c["worker_prefill_len"][i]),
            reason="not_new" if not_new[i] else "prefill",
            sched_num_prompt_tokens=int(c["sched_num_prompt_tokens"][i]),
        )


def check_slot_holder(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """M5: a slot holds one request: a request that takes it is its only user from that step on,
    so no step of the previous owner runs on it after it passed on (two requests writing one
    slot, the previous owner's steps still in flight), INV-M5. The holder of each slot is carried
    across frames."""
    c = frame.c
    # slot -> (the request holding it, the step it took it), as of the frames checked so far
    holders: dict[int, tuple[int, int]] = chk.rule_state.setdefault("M5-slot-holders", {})
    rows = np.flatnonzero(frame.own & ~c["worker_slot_is_null"])
    if not len(rows):
        return
    slot, step, request = c["worker_slot"][rows].astype(np.int64), c["step"][rows], c["request"][rows]
    took = (c["worker_new_life"][rows] == 1) | (c["worker_slot_prev_owner"][rows] != None)  # noqa: E711
    order = np.lexsort((~took, step, slot))  # per slot, in step order, a step's taker first
    slot, step, request, took, rows = slot[order], step[order], request[order], took[order], rows[order]
    pos = np.arange(len(rows))
    starts = np.r_[True, slot[1:] != slot[:-1]]
    segment_start = np.maximum.accumulate(np.where(starts, pos, 0))
    last_take = np.maximum.accumulate(np.where(took, pos, -1))
    carried = np.array([holders.get(int(s), (-1, -1)) for s in slot], dtype=np.int64).reshape(-1, 2)
    here = last_take >= segment_start
    holder = np.where(here, request[np.maximum(last_take, 0)], carried[:, 0])
    taken_at = np.where(here, step[np.maximum(last_take, 0)], carried[:, 1])
    shared = (holder >= 0) & (holder != request)
    violated = np.zeros(frame.size, dtype=bool)
    violated[rows[shared]] = True
    at = np.full(frame.size, -1, dtype=np.int64)
    at[rows] = pos
    for i in chk.first_per_request("M5-slot-holder", frame, violated):
        j = at[i]
        yield chk.finding(
            frame,
            "M5-slot-holder",
            i,
            "worker_slot",
            chk.names[holder[j]],
            int(slot[j]),
            holder=chk.names[holder[j]],
            taken_at=int(taken_at[j]) if taken_at[j] >= 0 else None,
        )
    ends = np.r_[starts[1:], True]
    for j in np.flatnonzero(ends & (last_take >= segment_start)):
        holders[int(slot[j])] = (int(request[last_take[j]]), int(step[last_take[j]]))
