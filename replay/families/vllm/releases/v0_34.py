"""vLLM 0.34.0 (2026-11-16): 0.33.0's rules and what changed from them (models/releases.py says
where each field is in vLLM's sources): Model Runner V1 removed, so its scheduler serves MRV2
only; resumed requests admitted in order; MRV2's draft handler keeps every live request's width;
Triton required on x86. Its scheduler and, on specreplay's CPU stand-ins, its whole engine run
here from vLLM's own wheel (scripts/vllm-0.34.sh: its own environment)."""

import dataclasses

from specreplay.replay.families.vllm.releases.v0_33 import RELEASE as BEFORE

RELEASE = dataclasses.replace(
    BEFORE,
    version="0.34.0",
    removed_runners=("vllm.v1.worker.gpu_model_runner:GPUModelRunner",),
    serves_mrv2_only=True,
    resumed_in_admission_order=True,
    mrv2_drafts_of_live_requests=True,
    needs_triton=True,
    cpu_stand_ins=True,
)
