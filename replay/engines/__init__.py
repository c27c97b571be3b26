"""engines: one driver loop for every engine (reference, real vLLM scheduler, live vLLM).

Holds the registry of engines and runner families (registry.py), the run entry point, the loop
in vLLM's step_with_batch_queue order, the input driver and the typed control events with their
one driver (events.py), the run's outcome, the vLLM setup, the real-scheduler adapter, the live
engine and its plugin, and SGLang's real scheduler in its own event loop (sglang_*.py). Imports
every stage but check.
"""
