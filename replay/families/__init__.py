"""families: each engine family in its own folder, behind the registry's questions.

A family is what a recording's worker view and a run's engine belong to: vLLM's V1 runner, vLLM's
Model Runner V2 (both of the vLLM engine line, sharing its scheduler side, its live and attached
machinery and its releases), and SGLang's scheduler with the reference SGLang worker. Each folder
uses the same module names for the same roles: `runner` / `worker` (the reference model of the
family's worker), `observer` (its worker view, live and reference alike), `outcomes` (a
recording's outcomes as a replay's oracle), `setup` (installing and importing the real engine),
`variants` (the built-in variants), `view` (its lanes in `show` and `export`).

    vllm/          the vLLM engine line: plugin, live and attached recording, flight recorder, part
                   files, forced logits, drafters, setup, the real-scheduler adapter, variants,
                   recorded outcomes and inputs
      releases/    one module per modelled vLLM release (what the reference models read)
      v1/          vLLM's V1 GPUModelRunner: the reference runner, its input batch, its observer
      mrv2/        vLLM's Model Runner V2: the reference runner, its batch and states, its
                   observer, the Triton interpreter on CPU
    sglang/        SGLang 0.5.23's scheduler: setup, its event loop, the reference worker and the
                   driver's workers, observer and KV truth, variants and their forms, outcomes

Generic code never compares a family's or an engine line's name and never branches on a
capability flag: it asks the registry (engines/registry.py: engines and runner families) or a
trace's family traits (traces/families.py). tests/test_seams.py holds that; docs/architecture.md
has the recipes for adding a family and a vLLM release.
"""
