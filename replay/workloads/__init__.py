"""workloads: what a run is asked to do, and what it should produce.

Holds the engine config, workloads and their TOML form (and a one-line notation for tests),
the requests' prompts (explicit, a shared prefix, a conversation's turns), the named scenarios,
the random generators, the token arithmetic and the oracle. Imports nothing from the other stages.
"""
