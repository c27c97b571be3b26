"""engines: one driver loop for every engine (reference, real vLLM scheduler, live vLLM).

Holds the run entry point, the loop in vLLM's step_with_batch_queue order, the input driver,
the vLLM setup, the real-scheduler adapter, the live engine and its plugin. Imports every stage but check.
"""
