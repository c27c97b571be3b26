"""models: specreplay's reference models of vLLM 0.32.0's scheduler and GPU model runner.

Holds the messages between them, the scheduler's requests and KV blocks, the scheduler, the
runner's input batch, the tiny target model and the runner; the reference SGLang worker.
Imports only workloads.
"""
