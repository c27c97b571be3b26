"""The trace schema: one explicit pyarrow schema for every specreplay trace.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli. The recorder (`specreplay.replay.observers.recorder`) fills these
columns, the writer stamps the metadata, the reader validates files against this schema, and the
checker and the trace diff read nothing else.

One row = one request at one engine step (one `schedule()` call). A request has a row at every
step from its arrival until the step that announces it finished (`sched_finished_announced`).
Column prefixes say which side wrote the value:

- `sched_` the scheduler view at E1(m), values as copied into `S_m` ("pre" values);
- `apply_` what `update_from_output(S_m)` did when the engine applied this step's output later;
- `worker_` the GPU runner's view at E2(m)/E3(m);
- `truth_` ground truth kept by the reference runner's KV cache (what the GPU really holds).

Counter names are vLLM's so a trace lines up with the engine. Nulls mean "not applicable"
(for example `worker_*` of a request that is not in the worker's batch at that step).

An SGLang trace (`--engine sglang-scheduler`, runner family `sglang`) has the same rows, one per
request per loop iteration of SGLang's scheduler (the step: its `recv_requests` call), and fills
the columns whose meaning is the same; the columns whose description starts "(SGLang)" are its
own and null on a vLLM row, and a description says what a vLLM column holds on an SGLang row
where that differs (`engines` in the table: vllm, sglang or all).
"""

from __future__ import annotations

import pyarrow as pa

#: v2 (specreplay 0.2): request lives and control events (sched_life, sched_event, step_event,
#: the in-flight and stale token counters, apply_outcome, apply_life).
#: v3: the run's outcomes (apply_sampled_token_ids) and, for attached runs, the recorded inputs
#: (META_INPUTS). v2 files are still read: the columns v3 added come back null.
#: v4: the physical KV cache's evidence (truth_kv_foreign_*, truth_kv_unowned_*,
#: truth_kv_block_owner) and worker_kept_finished. v2 and v3 files read with those null.
#: v5: Model Runner V2's worker view (worker_slot, the device and CPU-mirror counts, the verified
#: drafts' provenance, rejections, sampled ids, new lives, slot reuse, preempted frees). Older
#: files read with those null; a V1 runner's rows leave them null too (`RUNNER_COLUMNS`).
#: v6: truth_unfilled_draft_slots (padding verified as drafts). Older files read with it null.
#: v7: SGLang's scheduler and worker views (the "(SGLang)" columns: step_forward_mode, sched_kv_*,
#: sched_seq_len, sched_req_pool_idx, apply_kv_*, apply_skip_reason, the release's columns,
#: worker_seq_len, worker_new_seq_len) and the skip 'prefill'. Older files read with them null.
#: v8: vLLM's prefix caching (sched_num_cached_tokens, sched_cache_hit_blocks,
#: step_cache_evictions, truth_cache_hit_valid, truth_cache_hit_writer); sched_num_computed_tokens
#: of an admitted request is the count its step starts from (its prefix-cache hit: 0 before v8,
#: when nothing was cached). Older files read with the new columns null, and ran without prefix
#: caching (replay reads their config so: `PREFIX_CACHING_SCHEMA`).
#: v9: what each preemption returned to the free pool (sched_preempt_blocks_alone,
#: sched_preempt_blocks_returned). Older files read with them null.
#: v10: a KV connector's tokens booked at an admission (sched_kv_external_tokens). Older files
#: read with it null.
SCHEMA_VERSION = 10
OLDEST_READ = 2
#: The first schema version whose runs may have had prefix caching on.
PREFIX_CACHING_SCHEMA = 8

#: Status of the request in the scheduler after `schedule()` of this step.
STATUSES = ("waiting", "running", "preempted", "finished")
#: How the request appears in `S_m`.
#: new: first scheduling (NewRequestData); cached: scheduled, also scheduled at m-1;
#: reentering: scheduled, running, but not scheduled at m-1; resumed: back from PREEMPTED;
#: unscheduled: not in `S_m` at all.
KINDS = ("new", "cached", "reentering", "resumed", "unscheduled")
#: Why a live request got no tokens at this step ("" when it was scheduled).
#: budget: the running loop stopped (budget 0) before reaching it; max_tokens: skipped by the
#: max-tokens rule; no_tokens: visited but its demand was 0; preempted: preempted for KV blocks
#: in this step; waiting: in the waiting queue and not admitted; finished: finished before m.
#: prefill (SGLang): running, but the iteration ran a prefill batch, which SGLang schedules first.
#: On an SGLang row, max_tokens is a request update_running_batch left out because its result in
#: flight finishes it by length (_reqs_finishing_inflight), no_tokens one whose decode it deferred.
SKIPS = ("", "budget", "max_tokens", "no_tokens", "preempted", "waiting", "finished", "prefill")
#: Why `update_from_output` finished the request ("" when it did not).
FINISH_REASONS = ("", "length", "stop", "aborted")
#: The control event that changed the request right before this step's schedule() ("" when none).
#: abort: finished from outside (an abort, or a pause in abort mode); reset_preempt: preempted by
#: reset_prefix_cache(reset_running_requests=True), its in-flight outputs to be dropped;
#: resubmit: a new life of a request id whose previous life finished or was aborted;
#: stream_turn: a streaming session's turn ended (its in-flight outputs to be dropped), and it
#: took its next input chunk if one was there; stream_update: an input chunk arrived for it.
EVENTS = ("", "abort", "reset_preempt", "resubmit", "stream_turn", "stream_update")
#: What update_from_output did with the output of S_m for the request (null: not popped yet).
#: applied: tokens appended and counters moved; stale_delivered: in flight across a KV-pressure
#: preemption, tokens appended but counters untouched (vLLM's deliver mode); dropped: in flight
#: across a cache reset (drop mode), ignored entirely; ignored: the request was finished or gone.
APPLY_OUTCOMES = ("applied", "stale_delivered", "dropped", "ignored")
#: (SGLang) The forward mode of the iteration's batch (ForwardMode, lower case; a spec v2 decode
#: batch runs as target_verify).
FORWARD_MODES = ("extend", "decode", "target_verify", "mixed", "idle")
#: (SGLang) Why process_batch_result skipped a row ("" when it applied it): the request had
#: finished, or had been retracted, before its result was processed.
APPLY_SKIP_REASONS = ("", "finished", "retracted")

_ENUM = pa.dictionary(pa.int8(), pa.string())
_TEXT = pa.dictionary(pa.int16(), pa.string())  # free text with few distinct values

# (name, type, nullable, one-line description). The column table of docs/trace-format.md is generated from
# this list (`specreplay schema`), so the description is the documentation.
COLUMNS: tuple[tuple[str, pa.DataType, bool, str], ...] = (
    ("step", pa.int32(), False, "engine step m, 1-based: one schedule() call"),
    ("request_id", pa.string(), False, "vLLM request id"),
    (
        "sched_life",
        pa.int16(),
        False,
        "which life of the request id the row describes: 0, then +1 per resubmission of the id",
    ),
    (
        "step_total_scheduled_tokens",
        pa.int32(),
        False,
        "scheduler: S_m.total_num_scheduled_tokens (same on every row of the step)",
    ),
    (
        "step_event",
        _TEXT,
        False,
        "engine: control events applied since the previous schedule(), e.g. 'pause(keep); "
        "reset_prefix_cache(running)' (same on every row of the step; '' when none)",
    ),
    (
        "step_cache_evictions",
        pa.int32(),
        True,
        "scheduler: cached KV blocks this step's schedule() evicted: free blocks holding a prefix-cache hash, "
        "handed out again and their hash dropped (same on every row of the step; null: no prefix caching)",
    ),
    (
        "step_forward_mode",
        _ENUM,
        True,
        f"(SGLang) engine: the forward mode of the batch the iteration ran, one of {FORWARD_MODES} (null: none)",
    ),
    ("sched_event", _ENUM, False, f"scheduler: control event on this request before schedule(), one of {EVENTS}"),
    # ---- scheduler view at E1(m) ----
    (
        "sched_status",
        _ENUM,
        False,
        f"scheduler: status after schedule(), one of {STATUSES} (SGLang: preempted is retracted, back in the "
        "waiting queue until its re-prefill)",
    ),
    ("sched_kind", _ENUM, False, f"scheduler: how the request appears in S_m, one of {KINDS}"),
    ("sched_skip", _ENUM, False, f"scheduler: why it got no tokens, one of {SKIPS}"),
    (
        "sched_num_scheduled_tokens",
        pa.int32(),
        False,
        "scheduler: num_scheduled_tokens[r] in S_m, draft slots included (tokens; SGLang: its extend length, "
        "1 to decode, k + 1 to verify)",
    ),
    (
        "sched_num_draft_slots",
        pa.int16(),
        False,
        "scheduler: len(scheduled_spec_decode_tokens[r]) in S_m (tokens; SGLang: k on a verify row)",
    ),
    (
        "sched_num_computed_tokens",
        pa.int32(),
        False,
        "scheduler: Request.num_computed_tokens before this step's advance, as S_m carries it (tokens; a request "
        "admitted at m: the count its step starts from, its prefix-cache hit; SGLang: Req.kv.kv_committed_len "
        "before the iteration's scheduling)",
    ),
    (
        "sched_num_cached_tokens",
        pa.int32(),
        True,
        "scheduler: on a request's admission (new or resumed), the tokens its prefix-cache hit covered, whole "
        "blocks of another request's (or its own earlier) KV it starts from (0: none; null: not admitted at m)",
    ),
    (
        "sched_cache_hit_blocks",
        pa.list_(pa.int32()),
        True,
        "scheduler: the block ids of that hit, in order (null: none)",
    ),
    (
        "sched_kv_external_tokens",
        pa.int32(),
        True,
        "scheduler (KV connector): on the row that admits r, the tokens a KV connector supplied as computed, booked "
        "with the admission (vLLM's num_external_computed_tokens); sched_num_cached_tokens is then the local prefix "
        "cache's part alone (null: no connector, or none supplied)",
    ),
    (
        "sched_num_output_placeholders",
        pa.int32(),
        False,
        "scheduler: Request.num_output_placeholders before this step's advance (tokens; SGLang: 0, it has none)",
    ),
    (
        "sched_num_tokens",
        pa.int32(),
        False,
        "scheduler: Request.num_tokens = prompt + applied outputs (SGLang: Req.seqlen)",
    ),
    ("sched_num_output_tokens", pa.int32(), False, "scheduler: applied output tokens (SGLang: len(Req.output_ids))"),
    ("sched_num_prompt_tokens", pa.int32(), False, "scheduler: prompt length (tokens)"),
    (
        "sched_spec_len",
        pa.int16(),
        False,
        "scheduler: len(Request.spec_token_ids) when schedule() started (draft slots it may book; SGLang: 0)",
    ),
    (
        "sched_spec_placeholders",
        pa.bool_(),
        False,
        "scheduler: spec_token_ids was a non-empty list of -1 placeholders when schedule() started (SGLang: false)",
    ),
    (
        "sched_is_prefill_chunk",
        pa.bool_(),
        False,
        "scheduler: after schedule(), C < num_tokens + P (this step samples nothing; SGLang: an extend that ends "
        "before the request's fill)",
    ),
    (
        "sched_finished_announced",
        pa.bool_(),
        False,
        "scheduler: request_id is in S_m.finished_req_ids (SGLang: the iteration finished and released it, or "
        "answered its abort in the waiting queue: its last row)",
    ),
    (
        "sched_preempted",
        pa.bool_(),
        False,
        "scheduler: preempted during this schedule() call (SGLang: retracted by update_running_batch)",
    ),
    (
        "sched_num_in_flight_tokens",
        pa.int32(),
        False,
        "scheduler: Request.num_in_flight_tokens before schedule(): scheduled tokens of outputs not yet applied "
        "(SGLang: of batches launched whose results are not processed yet)",
    ),
    (
        "sched_num_stale_output_tokens",
        pa.int32(),
        False,
        "scheduler: Request.num_stale_output_tokens before schedule(): the in-flight share from before the last "
        "preemption or cache reset (tokens; SGLang: 0)",
    ),
    (
        "sched_preempt_blocks_alone",
        pa.int32(),
        True,
        "scheduler: for a request this schedule() preempted, the KV blocks it held that no other request held "
        "(its free returns them to the pool) (null: not preempted at m, or the block pool not read; SGLang: null)",
    ),
    (
        "sched_preempt_blocks_returned",
        pa.int32(),
        True,
        "scheduler: the free blocks the pool gained by that preemption, read right after it (fewer than "
        "sched_preempt_blocks_alone: its free was deferred, e.g. behind a step in flight) (null: as above)",
    ),
    (
        "sched_kv_committed_len",
        pa.int32(),
        True,
        "(SGLang) scheduler: Req.kv.kv_committed_len after the iteration's scheduling (tokens whose KV is committed)",
    ),
    (
        "sched_kv_allocated_len",
        pa.int32(),
        True,
        "(SGLang) scheduler: Req.kv.kv_allocated_len after the iteration's scheduling (KV slots it holds)",
    ),
    (
        "sched_seq_len",
        pa.int32(),
        True,
        "(SGLang) scheduler: r's seq_lens entry in the batch the scheduler built (before the FutureMap's "
        "resolution; null: not in it)",
    ),
    (
        "sched_req_pool_idx",
        pa.int32(),
        True,
        "(SGLang) scheduler: Req.kv.req_pool_idx, its req_to_token row and FutureMap slot (null: none held)",
    ),
    # ---- what update_from_output(S_m) did, filled in when it ran ----
    (
        "apply_step",
        pa.int32(),
        True,
        "engine step whose iteration popped S_m's output for update_from_output (null: never; SGLang: the "
        "iteration whose process_batch_result took the batch's result)",
    ),
    ("apply_outcome", _ENUM, True, f"scheduler: what update_from_output did with it, one of {APPLY_OUTCOMES}"),
    (
        "apply_life",
        pa.int16(),
        True,
        "scheduler: the life of the request object the output was given to (null: ignored)",
    ),
    (
        "apply_num_scheduled_tokens",
        pa.int32(),
        True,
        "scheduler: num_scheduled_tokens[r] as update_from_output read it back (tokens)",
    ),
    (
        "apply_num_draft_slots",
        pa.int16(),
        True,
        "scheduler: len(scheduled_spec_decode_tokens[r]) as update_from_output read it back (tokens)",
    ),
    (
        "apply_num_rejected",
        pa.int16(),
        True,
        "scheduler: rejected drafts it subtracted from C and P (SGLang: drafts the verify rejected, k + 1 - accept "
        "length; it commits the accepted ones instead)",
    ),
    (
        "apply_num_tokens",
        pa.int16(),
        True,
        "scheduler: output tokens appended (after stop truncation; SGLang: Req.output_ids' growth, which a verify "
        "round's accepted run can carry past a stop or max_tokens)",
    ),
    (
        "apply_sampled_token_ids",
        pa.list_(pa.int32()),
        True,
        "scheduler: the token ids the output carried for r as update_from_output received them (the "
        "worker's sampled tokens: 1 + accepted drafts), before it trimmed them at a stop or max_tokens",
    ),
    (
        "apply_token_mismatches",
        pa.int16(),
        True,
        "truth: appended tokens that differ from the request's expected token sequence",
    ),
    (
        "apply_num_computed_tokens",
        pa.int32(),
        True,
        "scheduler: num_computed_tokens after the apply (SGLang: Req.kv.kv_committed_len after it)",
    ),
    (
        "apply_num_output_placeholders",
        pa.int32(),
        True,
        "scheduler: num_output_placeholders after the apply (SGLang: 0)",
    ),
    ("apply_finish_reason", _ENUM, True, f"scheduler: finish caused by the apply, one of {FINISH_REASONS}"),
    (
        "apply_kv_committed_len",
        pa.int32(),
        True,
        "(SGLang) scheduler: Req.kv.kv_committed_len after process_batch_result (rows it skipped too)",
    ),
    (
        "apply_kv_allocated_len",
        pa.int32(),
        True,
        "(SGLang) scheduler: Req.kv.kv_allocated_len after process_batch_result (rows it skipped too)",
    ),
    (
        "apply_skip_reason",
        _ENUM,
        True,
        f"(SGLang) scheduler: why process_batch_result skipped the row, one of {APPLY_SKIP_REASONS} ('': applied)",
    ),
    (
        "apply_released_committed_len",
        pa.int32(),
        True,
        "(SGLang) scheduler: kv_committed_len when release_kv_cache released the finished request (on the row "
        "whose result's processing released it; an aborted chunked prefill, which the scheduling releases: its row "
        "of that iteration; null: not released there)",
    ),
    (
        "apply_released_allocated_len",
        pa.int32(),
        True,
        "(SGLang) scheduler: kv_allocated_len at that release (the slots past owned_kv_len are freed)",
    ),
    (
        "apply_owned_kv_len",
        pa.int32(),
        True,
        "(SGLang) scheduler: Req.owned_kv_len() at that release: the radix insert bound, min(committed, prompt + "
        "outputs through the stop)",
    ),
    (
        "apply_release_checkpointed",
        pa.bool_(),
        True,
        "(SGLang) scheduler: that release inserted the request's KV into the radix cache (checkpoint)",
    ),
    # ---- worker view at E2(m) / E3(m) ----
    (
        "worker_row",
        pa.int16(),
        True,
        "worker: batch row (V1: persistent batch after condense; MRV2: in idx_mapping; SGLang: in the ScheduleBatch)",
    ),
    (
        "worker_num_scheduled_tokens",
        pa.int32(),
        True,
        "worker: tokens it executed for r (differs from the scheduler's if it edited S_m)",
    ),
    ("worker_num_draft_slots", pa.int16(), True, "worker: draft slots it verified for r"),
    (
        "worker_num_computed_tokens",
        pa.int32(),
        True,
        "worker: CachedRequestState.num_computed_tokens after its correction (first position written)",
    ),
    (
        "worker_first_position",
        pa.int32(),
        True,
        "worker: position of r's first token this step (the device-side corrected value it writes KV at; SGLang: "
        "prefix_len, seq_len - 1 to decode, seq_len to verify)",
    ),
    ("worker_correction", pa.int16(), True, "worker: rejected drafts of m-1 it subtracted (tokens)"),
    ("worker_in_prev_map", pa.bool_(), True, "worker: r in prev_req_id_to_index after the removals"),
    (
        "worker_cached_drafts",
        pa.int16(),
        True,
        "worker: drafts cached for r from the previous step (0: no scatter source row)",
    ),
    (
        "worker_draft_ids",
        pa.list_(pa.int32()),
        True,
        "worker: draft ids fed to the model for r (before any clamp; SGLang: the k drafts it verified)",
    ),
    ("worker_negative_inputs", pa.int16(), True, "worker: input ids < 0 for r before any clamp"),
    (
        "worker_num_accepted",
        pa.int16(),
        True,
        "worker: drafts accepted by the rejection sampler (SGLang: by the greedy verify; accept length - 1)",
    ),
    (
        "worker_num_emitted",
        pa.int16(),
        True,
        "worker: tokens emitted, 1 + accepted, 0 if discarded (SGLang: 0 for an extend that ends before the fill)",
    ),
    ("worker_num_output_tokens", pa.int32(), True, "worker: len(output_token_ids) after _update_states"),
    (
        "worker_edited_output",
        pa.bool_(),
        True,
        "worker: it changed r's entries in the SchedulerOutput (SGLang: r's seq_lens or req_pool_indices entry of "
        "the ScheduleBatch it was handed)",
    ),
    (
        "worker_kept_finished",
        pa.bool_(),
        True,
        "worker: on the row announcing r finished, r's cached state or batch row outlived _update_states "
        "(null: not announced at this step)",
    ),
    # ---- worker view, Model Runner V2 only (vllm/v1/worker/gpu/; families/vllm/mrv2/observer.py) ----
    (
        "worker_slot",
        pa.int16(),
        True,
        "worker (MRV2): r's slot in req_states, held from its arrival to its finish or preemption",
    ),
    (
        "worker_device_computed_before",
        pa.int32(),
        True,
        "worker (MRV2): the device num_computed_tokens of r's slot when the step ran, before post_update",
    ),
    (
        "worker_device_computed_after",
        pa.int32(),
        True,
        "worker (MRV2): the device num_computed_tokens of r's slot after post_update (+ query_len - rejected)",
    ),
    (
        "worker_cpu_computed",
        pa.int32(),
        True,
        "worker (MRV2): the CPU mirror num_computed_tokens_np of r's slot after update_requests (scheduler's value)",
    ),
    ("worker_query_len", pa.int32(), True, "worker (MRV2): r's query length as the batch ran it (query_start_loc)"),
    ("worker_num_rejected", pa.int16(), True, "worker (MRV2): drafts of r the rejection sampler rejected"),
    (
        "worker_sampled_ids",
        pa.list_(pa.int32()),
        True,
        "worker (MRV2): the ids sampled for r (the first num_sampled; SGLang: the tokens it emitted, a verify's "
        "accepted run)",
    ),
    (
        "worker_draft_proposed_step",
        pa.int32(),
        True,
        "worker (MRV2): the step whose propose wrote the drafts r verified into its slot (null: none since it took it)",
    ),
    (
        "worker_draft_proposed_for",
        pa.string(),
        True,
        "worker (MRV2): the request that held the slot when those drafts were written",
    ),
    (
        "worker_draft_base",
        pa.int32(),
        True,
        "worker (MRV2): the device count of the slot right after the step that proposed them (where they follow)",
    ),
    ("worker_new_life", pa.bool_(), True, "worker (MRV2): r arrived in scheduled_new_reqs at this step (a new slot)"),
    (
        "worker_prefill_len",
        pa.int32(),
        True,
        "worker (MRV2): the slot's prefill length (prompt, plus the outputs of a preempted request resumed as new)",
    ),
    (
        "worker_slot_prev_owner",
        pa.string(),
        True,
        "worker (MRV2): on the step r took its slot, the request that held the slot before (null: none)",
    ),
    (
        "worker_slot_last_write_step",
        pa.int32(),
        True,
        "worker (MRV2): on the step r took its slot, the last step whose post_update wrote that slot (null: never)",
    ),
    (
        "worker_freed_preempted",
        pa.bool_(),
        True,
        "worker (MRV2): on the row of the step listing r preempted, its slot was freed (null: not listed)",
    ),
    # ---- worker view, SGLang only (families/sglang/worker.py; families/sglang/observer.py) ----
    (
        "worker_seq_len",
        pa.int32(),
        True,
        "(SGLang) worker: r's seq_lens entry the worker ran with, after the FutureMap's resolution (spec v2: the "
        "committed length its verify round starts at)",
    ),
    (
        "worker_new_seq_len",
        pa.int32(),
        True,
        "(SGLang) worker: the new seq_lens entry it handed back and published to the FutureMap (spec v2: seq_len + "
        "accept length, an extend's seq_len; null: non-spec, it hands back none)",
    ),
    # ---- ground truth of the reference runner ----
    (
        "truth_num_computed_tokens",
        pa.int32(),
        True,
        "truth: tokens of r whose KV is valid at the start of the step (K_r(m))",
    ),
    ("truth_kv_after", pa.int32(), True, "truth: valid KV tokens of r after the step"),
    (
        "truth_kv_ok",
        pa.bool_(),
        True,
        "truth: every valid KV position of r holds its expected token and nothing was skipped",
    ),
    (
        "truth_kv_foreign_positions",
        pa.int32(),
        True,
        "truth: valid KV positions of r that hold another request's tokens after the step's writes, read "
        "back from the blocks (tokens)",
    ),
    ("truth_kv_foreign_writer", pa.string(), True, "truth: the request whose tokens they are (null: none)"),
    (
        "truth_kv_unowned_blocks",
        pa.int16(),
        True,
        "truth: blocks of the table the worker ran r with that the scheduler's KV manager does not hold for r "
        "(freed, or another request's)",
    ),
    (
        "truth_kv_block_owner",
        pa.string(),
        True,
        "truth: who holds the first of those blocks in the scheduler ('': nobody, it is free; null: none)",
    ),
    (
        "truth_kv_unowned_writes",
        pa.int32(),
        True,
        "truth: positions r's step wrote into those blocks (tokens)",
    ),
    (
        "truth_cache_hit_valid",
        pa.int32(),
        True,
        "truth: on a request's admission, how many of the positions its prefix-cache hit covers hold the KV of the "
        "request's own tokens when its step reads them (0 without a hit; null: not admitted at m)",
    ),
    (
        "truth_cache_hit_writer",
        pa.string(),
        True,
        "truth: who wrote the first hit position that does not ('': never written; null: none)",
    ),
    (
        "truth_unfilled_draft_slots",
        pa.int16(),
        True,
        "truth: draft slots the worker verified for r that its drafter left unfilled after the step "
        "before (it skipped r or proposed fewer): padding verified as drafts; null: no proposal known",
    ),
)

SCHEMA_FIELDS = [pa.field(name, typ, nullable=nullable) for name, typ, nullable, _ in COLUMNS]
SCHEMA = pa.schema(SCHEMA_FIELDS)
COLUMN_NAMES = tuple(name for name, *_ in COLUMNS)
DESCRIPTIONS = {name: doc for name, _, _, doc in COLUMNS}


def empty_table() -> pa.Table:
    """A table of the schema with no rows. Not `SCHEMA.empty_table()`: pyarrow's imports pandas
    where it is installed, half a second of every command that reads a trace's header."""
    return pa.Table.from_batches([], schema=SCHEMA)


#: Which side writes each column, and when; the code's column lists are derived from this (the
#: recorder's row layout and its later groups), never written out again by hand:
#:   step       the engine, once per step (the same value on every row of the step)
#:   scheduler  the scheduler observer at E1(m): the request's id and the `sched_` view
#:   apply      the scheduler observer at E4(j), when update_from_output(S_m) ran: `apply_`
#:   worker     the worker observer at E3(m): `worker_`
#:   truth      the KV ground truth at E3(m): `truth_`
WRITERS = ("step", "scheduler", "apply", "worker", "truth")
_WRITER_OF_PREFIX = {"step": "step", "sched": "scheduler", "apply": "apply", "worker": "worker", "truth": "truth"}
WRITTEN_BY = {
    name: "scheduler" if name == "request_id" else _WRITER_OF_PREFIX[name.split("_", 1)[0]] for name in COLUMN_NAMES
}


def columns_written_by(*writers: str) -> tuple[str, ...]:
    """The columns `writers` write, in schema order."""
    unknown = set(writers) - set(WRITERS)
    assert not unknown, f"no such writer: {sorted(unknown)}"
    return tuple(name for name in COLUMN_NAMES if WRITTEN_BY[name] in writers)


def in_schema_order(names: set[str] | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """`names`, each a column, in schema order (a derived column list reads like the schema)."""
    unknown = set(names) - set(COLUMN_NAMES)
    assert not unknown, f"not schema columns: {sorted(unknown)}"
    return tuple(name for name in COLUMN_NAMES if name in names)


#: Allowed values of the enum columns, checked by the reader.
#: The schema version that added each column after v2; a file of an older version has them null,
#: and a diff against it leaves them out.
ADDED_IN = {
    "apply_sampled_token_ids": 3,
    "worker_kept_finished": 4,
    "truth_kv_foreign_positions": 4,
    "truth_kv_foreign_writer": 4,
    "truth_kv_unowned_blocks": 4,
    "truth_kv_block_owner": 4,
    "truth_kv_unowned_writes": 4,
    "truth_unfilled_draft_slots": 6,
    "step_cache_evictions": 8,
    "sched_num_cached_tokens": 8,
    "sched_cache_hit_blocks": 8,
    "truth_cache_hit_valid": 8,
    "truth_cache_hit_writer": 8,
    "sched_preempt_blocks_alone": 9,
    "sched_preempt_blocks_returned": 9,
    "sched_kv_external_tokens": 10,
    **{name: 5 for name, _type, _nullable, doc in COLUMNS if doc.startswith("worker (MRV2)")},
    **{name: 7 for name, _type, _nullable, doc in COLUMNS if doc.startswith("(SGLang)")},
}

#: SGLang's own columns, null on a vLLM row (`--engine sglang-scheduler`).
SGLANG_ONLY = tuple(name for name, _type, _nullable, doc in COLUMNS if doc.startswith("(SGLang)"))
#: A KV connector's columns, null where none ran (filled on the rows it concerns, after they are appended).
CONNECTOR_ONLY = tuple(name for name, _type, _nullable, doc in COLUMNS if "(KV connector)" in doc)
#: The worker columns each runner family's observer fills (the rest of `worker_` stays null on
#: its rows): V1's persistent-batch view, MRV2's slot view, the reference SGLang worker's batch
#: view (the vLLM columns whose meaning is the same, and its own). `specreplay schema` shows them.
MRV2_ONLY = tuple(name for name, _type, _nullable, doc in COLUMNS if doc.startswith("worker (MRV2)"))
V1_ONLY = (
    "worker_num_computed_tokens",
    "worker_correction",
    "worker_in_prev_map",
    "worker_cached_drafts",
    "worker_num_output_tokens",
)
SGLANG_WORKER_SHARED = (
    "worker_row",
    "worker_num_scheduled_tokens",
    "worker_num_draft_slots",
    "worker_first_position",
    "worker_draft_ids",
    "worker_negative_inputs",
    "worker_num_accepted",
    "worker_num_emitted",
    "worker_edited_output",
    "worker_sampled_ids",
)
RUNNER_COLUMNS = {
    "v1": tuple(n for n in COLUMN_NAMES if n.startswith("worker_") and n not in MRV2_ONLY and n not in SGLANG_ONLY),
    "v2": tuple(n for n in COLUMN_NAMES if n.startswith("worker_") and n not in V1_ONLY and n not in SGLANG_ONLY),
    "sglang": tuple(
        n for n in COLUMN_NAMES if n.startswith("worker_") and (n in SGLANG_WORKER_SHARED or n in SGLANG_ONLY)
    ),
}


def columns_of_version(version: int) -> tuple[str, ...]:
    """The columns a trace of schema `version` holds."""
    return tuple(name for name in COLUMN_NAMES if ADDED_IN.get(name, OLDEST_READ) <= version)


ENUMS = {
    "sched_status": STATUSES,
    "sched_kind": KINDS,
    "sched_skip": SKIPS,
    "apply_finish_reason": FINISH_REASONS,
    "sched_event": EVENTS,
    "apply_outcome": APPLY_OUTCOMES,
    "step_forward_mode": FORWARD_MODES,
    "apply_skip_reason": APPLY_SKIP_REASONS,
}

# Key/value metadata keys (all values are UTF-8 JSON or plain text).
META_SCHEMA_VERSION = b"specreplay.schema_version"
META_VERSION = b"specreplay.version"
META_WORKLOAD = b"specreplay.workload"  # JSON: the workload, enough to replay it
META_CONFIG = b"specreplay.config"  # JSON: engine config
META_IMPL = b"specreplay.impl"  # JSON: implementation name, scheduler/runner classes, executor
META_SEED = b"specreplay.seed"
#: JSON: completed | crashed (step, kind, message) | step_limit (step) | partial (step: recovered
#: from a recording journal, rows of steps 1..step only)
META_OUTCOME = b"specreplay.outcome"
META_DEVICE = b"specreplay.device"
#: JSON, runs of a live or attached vLLM: the recorded inputs (each request life's prompt token
#: ids and sampling parameters, streaming chunks, aborts, pauses, cache resets) at the steps the
#: engine took them, which the workload only summarises (attached) or planned (live).
META_INPUTS = b"specreplay.inputs"
#: Metadata that legitimately differs between two recordings of the same run; kept out of
#: content comparisons.
META_VOLATILE = b"specreplay.volatile"  # JSON: created_at, host, torch version


def markdown_table() -> str:
    """The column reference as a markdown table (docs/trace-format.md and `specreplay schema`)."""
    lines = ["| column | type | null | engines | runners | meaning |", "| --- | --- | --- | --- | --- | --- |"]
    for name, typ, nullable, doc in COLUMNS:
        shown = "text" if typ == _TEXT else "enum" if pa.types.is_dictionary(typ) else str(typ)
        lines.append(
            f"| `{name}` | {shown} | {'yes' if nullable else 'no'} | {engines_of(name)} | {filled_by(name)} | {doc} |"
        )
    return "\n".join(lines)


def engines_of(name: str) -> str:
    """Which engines' traces fill a column: sglang (its own columns), vllm (the vLLM worker
    columns no SGLang runner fills), or all."""
    if name in SGLANG_ONLY:
        return "sglang"
    if name.startswith("worker_") and name not in RUNNER_COLUMNS["sglang"]:
        return "vllm"
    return "all"


def filled_by(name: str) -> str:
    """Which runner families' worker observers fill a worker column ('all' for the other columns)."""
    if not name.startswith("worker_"):
        return "all"
    return ", ".join(family for family, names in RUNNER_COLUMNS.items() if name in names)


#: What `specreplay schema` says before the table: which columns each runner's worker view fills.
RUNNERS_NOTE = (
    "The worker view is the runner's: a trace's `specreplay.impl` names the runner class that ran and its "
    "family (`runner_family`: v1, vLLM's V1 GPUModelRunner; v2, Model Runner V2, vllm/v1/worker/gpu/; sglang, "
    "the reference SGLang worker under SGLang's real scheduler, `--engine sglang-scheduler`; absent in traces "
    "from before v5: v1). The runners column says which family's observer fills a worker column; on the other "
    "families' rows it is null. The engines column says whose traces fill a column: sglang for SGLang's own "
    'columns (described "(SGLang)", null on a vLLM row), vllm for vLLM\'s worker columns no SGLang row fills; '
    "a vLLM column an SGLang row fills says what it holds there where that differs. Traces of an older schema "
    "version read with the columns added since null."
)
