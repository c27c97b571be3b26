"""specreplay.replay: the engines that produce traces and the tools that read them.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. The packages, in data-flow order; each may import only the packages above
it in this list (tests/test_architecture.py holds the rules):

    workloads/  what a run is asked to do: engine config, workloads, scenarios, generators,
                token arithmetic, the oracle (the tokens a correct engine produces)
    models/     the reference models of vLLM's scheduler and GPU model runner, and the
                messages between them (SchedulerOutput, ModelRunnerOutput); the reference
                SGLang worker
    impls/      the implementations under test: a registry of variants, each in a reference
                form and (where it has one) a real-vLLM form
    observers/  what watches any vLLM-shaped scheduler and runner from outside and writes
                the trace rows; the KV ground truth; the same for SGLang's scheduler
    engines/    one driver loop for every engine (reference, the real vLLM scheduler, a live
                vLLM), the input driver, the vLLM setup and plugin; SGLang's real scheduler
                in its own event loop
    check/      findings, the checker's catalogue and rule families, the trace diff: reads
                traces only (no models, engines or torch)
    workflows/  gate, explore, shrink, record to a file: what the CLI commands call
    views/      the terminal timeline and the Perfetto export (plain data)

`api` at this level is the public API for implementation authors (docs/implementations.md):
what a variant subclasses and receives. `scheduler`, `runner`, `engine`, `workload`, `checker`,
`variants` and `messages` are the old flat paths, deprecated re-exports (importing one warns).
"""
