"""The order the planner's rules run in, per device kind: the one place that says what runs before what.

Each step reads what earlier steps wrote, the plan's values on the draft and the typed fields of
its ``Work``, and writes its own. A step moved before one whose value it reads fails at once: a
``Work`` field not yet written raises AttributeError, a draft value not yet set KeyError.
"""

from __future__ import annotations

from collections.abc import Callable

from config.rules import cpu, gpu
from config.rules.frontend import cpu_frontend, page_processes, reply_metrics
from config.rules.graphs import cpu_graphs

CPU_STEPS: tuple[Callable[[cpu.CpuWork], None], ...] = (
    cpu.refuse_gpu_values,
    cpu.set_dtype,
    cpu.set_parallel,  # pipeline stages over the nodes; TP and DP are 1
    cpu.set_kv_cache,
    cpu.set_engines,
    cpu.set_environment,
    cpu.set_max_model_len,  # what the KV cache holds
    cpu.set_batching,
    cpu_graphs,
    cpu_frontend,
    page_processes,
    reply_metrics,
    cpu.set_engine_core_nice,
    cpu.add_memory,
)
"""vllm-cpu: the served dtype sizes the weights, the stages size the KV cache, the KV cache sizes the
context and the batch."""

GPU_STEPS: tuple[Callable[[gpu.GpuWork], None], ...] = (
    gpu.use_gpus,
    gpu.set_dtype,
    gpu.set_utilization,  # the memory share everything below is sized from
    gpu.set_parallel,  # TP and PP: the smallest split that fits, then the objective
    gpu.set_replicas,  # DP on the GPUs TP x PP leave, and the executor
    gpu.set_engines,  # engines per GPU group, for a small model on a big GPU
    gpu.set_sharing,  # time-slice or MPS, and each engine's memory share
    gpu.size_kv_cache,
    gpu.set_max_model_len,
    gpu.set_max_num_seqs,
    gpu.set_max_num_batched_tokens,
    gpu.set_graphs,
    gpu.set_frontend,  # async scheduling by the executor
    page_processes,
    reply_metrics,
    gpu.set_engine_core_nice,
    gpu.add_memory,
    gpu.fix_kv_cache,  # from the memory arithmetic, when engines share a GPU
)
"""A GPU plan: which GPUs, the served dtype, the memory share, then the split, the engines, the KV cache
at that split, and what the KV cache allows."""
