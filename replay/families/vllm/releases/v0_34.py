"""vLLM 0.34.0 (2026-11-16): 0.33.0's rules, Model Runner V1 gone, resumed requests admitted in
order, MRV2's per-request draft handler, Triton required on x86 (models/releases.py says where
each field is in vLLM's sources). Its scheduler runs here from vLLM's own wheel
(scripts/vllm-0.34.sh: its own environment)."""

from specreplay.replay.models.releases import Release

RELEASE = Release(
    "0.34.0",
    stop_rewinds_computed=True,
    placeholders_resolve_returned=True,
    continuing_requeued_after_cleanup=True,
    session_keeps_all_but_last=True,
    paused_rejects_new=True,
    apply_caches_in_flight=True,
    eagle_hash_lookahead=True,
    mrv2_skip_drafts=True,
    mrv2_zero_drafts_needs_k=True,
    mrv2_post_update_drafts=True,
    removed_runners=("vllm.v1.worker.gpu_model_runner:GPUModelRunner",),
    serves_mrv2_only=True,
    resumed_in_admission_order=True,
    needs_triton=True,
    mrv2_drafts_of_live_requests=True,
    cpu_stand_ins=True,
)
