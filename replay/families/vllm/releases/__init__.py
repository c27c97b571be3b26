"""vLLM's releases, one module each: the `Release` the reference models read for a workload's
`vllm_version` (models/releases.py names the fields and what each one decides).

Adding a release is a module here (`vMAJOR_MINOR.py` with `RELEASE = Release(...)`) and its
version in workloads/config.py MODELLED_VERSIONS; a behaviour no field covers yet is a new field
in models/releases.py and its branch where it applies (docs/architecture.md, "Adding a vLLM
release").
"""
