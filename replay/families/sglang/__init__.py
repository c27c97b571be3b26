"""SGLang 0.5.23's real scheduler with specreplay's reference SGLang worker (docs/sglang.md): setup,
the event loop that drives it, the reference worker and the driver's workers, the observer and
its KV truth, the built-in variants and their forms, a recording's outcomes, the workload shape."""
