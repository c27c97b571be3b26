"""vLLM 0.33.0 (2026-11-02): what changed from 0.32.0, field by field (models/releases.py says
where each one is in vLLM's sources). Its scheduler runs here from vLLM's own wheel
(scripts/vllm-0.33.sh: its own environment)."""

from specreplay.replay.models.releases import Release

RELEASE = Release(
    "0.33.0",
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
)
