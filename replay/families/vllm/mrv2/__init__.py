"""vLLM's Model Runner V2 (vllm/v1/worker/gpu/): the reference runner (runner.py) with its batch and
request states (batch.py, states.py), the worker observer that records the real one and the
reference alike (observer.py), and Triton's interpreter on a CPU machine (cpu_triton.py)."""
