"""vLLM's V1 GPUModelRunner: the reference runner (runner.py), its persistent batch (input_batch.py)
and the worker observer that records it, live and reference alike (observer.py)."""
