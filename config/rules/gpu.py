"""The GPU engine's path: which GPUs, then dtype, memory, parallel sizes, batching, CUDA graphs, front end."""

from __future__ import annotations

import math

from config.draft import Draft
from config.hardware import GPUInfo, Hardware, too_old_for_vllm
from config.model import ModelSpec
from config.plan import GIB, Memory
from config.rules.batching import gpu_max_num_batched_tokens, gpu_max_num_seqs, prefill_chunk
from config.rules.dtype import as_served, gpu_dtype
from config.rules.engines import gpu_engines, gpu_sharing, share_memory
from config.rules.frontend import gpu_frontend, page_processes, reply_metrics
from config.rules.graphs import gpu_graphs, whole_step_graphs
from config.rules.memory import (
    CUDA_RUNTIME_RESERVE,
    DEFAULT_GPU_UTILIZATION,
    MIN_CONTEXT,
    choose_max_len,
    gpu_reserve,
    gpu_utilization,
    kv_tokens,
    weights_per_gpu,
)
from config.rules.parallel import choose_parallel, choose_replicas
from config.settings import WorkloadSettings


def plan_gpu(draft: Draft, hardware: Hardware, model: ModelSpec, workload: WorkloadSettings) -> Memory:
    """Every GPU value on the draft; the memory arithmetic behind them, per GPU."""
    gpus = select_gpus(draft, hardware, model)
    draft.values["gpus"] = [g.index for g in gpus]
    draft.values["nodes"] = hardware.nodes
    gpn = len(gpus)
    smallest = min(gpus, key=lambda g: g.memory_bytes)
    model = as_served(model, gpu_dtype(draft, gpus, model))
    usable = gpu_utilization(draft, gpus, smallest)

    typical = workload.prompt_tokens + workload.reply_tokens
    min_tokens = draft.pins.get("max_model_len", workload.context or MIN_CONTEXT)
    mnbt_guess = draft.pins.get("max_num_batched_tokens", 8192)
    seqs_guess = draft.pins.get("max_num_seqs", 256)

    tp, pp = choose_parallel(draft, hardware, model, workload, usable, gpus, mnbt_guess, seqs_guess, min_tokens)
    dp = choose_replicas(draft, hardware, tp, pp, gpn)
    nodes = draft.values["nodes"] if tp * pp <= gpn else 1  # replicas on every node share the users
    whole_steps = whole_step_graphs(draft, gpus, model)
    weights = weights_per_gpu(model, tp, pp)
    engines = gpu_engines(draft, hardware, workload, weights, tp * pp, dp, nodes, smallest, whole_steps)
    gpu_sharing(draft, hardware, engines)
    if engines > 1:
        usable = share_memory(draft, engines, smallest, weights)

    # Memory arithmetic at the chosen split, per engine.
    kv_per_token = model.kv_bytes_per_token(tp, pp)
    users_per_replica = math.ceil(workload.users / (dp * engines * nodes))
    chunk, chunk_reason = prefill_chunk(workload.objective, smallest)
    mnbt = draft.pins.get("max_num_batched_tokens", chunk)
    reserve = gpu_reserve(model, tp, pp, mnbt, draft.pins.get("max_num_seqs", 256))
    budget = usable - weights - reserve
    kv = kv_tokens(model, tp, pp, usable, mnbt, draft.pins.get("max_num_seqs", 256))
    max_len = choose_max_len(draft, model, workload, kv, "the KV cache")
    seqs_fit = max(1, kv // typical)

    seqs = gpu_max_num_seqs(draft, workload, seqs_fit, dp * engines, users_per_replica)
    mnbt = gpu_max_num_batched_tokens(draft, chunk, seqs, chunk_reason)  # the pin, if any, wins there
    gpu_graphs(draft, gpus, model, mnbt)
    gpu_frontend(draft, hardware, model, workload, dp, engines, routed=engines > 1 or nodes > 1)
    page_processes(draft, hardware, model, workload)
    reply_metrics(draft, hardware)
    gpu_engine_core_nice(draft, hardware)
    return Memory(
        device_bytes=smallest.memory_bytes,
        usable_bytes=usable,
        weights_bytes=weights,
        reserve_bytes=reserve,
        kv_budget_bytes=max(budget, 0),
        kv_bytes_per_token=kv_per_token,
        kv_tokens=kv,
        max_model_len=max_len,
        concurrency_at_max_len=kv / max_len,
        typical_seq_tokens=typical,
        seqs_at_typical_len=seqs_fit,
    )


def select_gpus(draft: Draft, hardware: Hardware, model: ModelSpec) -> list[GPUInfo]:
    """The GPUs vLLM runs on (``GPUInfo.runs_vllm``): all, or only the larger kind when the
    smallest cannot hold the model alone."""
    gpus = [g for g in hardware.node.gpus if g.runs_vllm]  # some do: else the planner took the CPU path
    if too_old := [g for g in hardware.node.gpus if g not in gpus]:
        draft.warnings.append(f"left out: {too_old_for_vllm(too_old)}")
    kinds = {(g.name, g.memory_bytes) for g in gpus}
    if len(kinds) == 1:
        return gpus
    smallest = min(gpus, key=lambda g: g.memory_bytes)
    need = weights_per_gpu(model, 1, 1) + CUDA_RUNTIME_RESERVE
    names = ", ".join(f"{g.index}: {g.name} {g.memory_bytes / GIB:g} GiB" for g in gpus)
    if smallest.memory_bytes * DEFAULT_GPU_UTILIZATION >= need or "tensor_parallel_size" in draft.pins:
        draft.warnings.append(
            f"mixed GPUs ({names}): memory is planned to the smallest ({smallest.name}); "
            "each replica runs at the pace of its own GPU"
        )
        return gpus
    largest = max(gpus, key=lambda g: g.memory_bytes)
    keep = [g for g in gpus if (g.name, g.memory_bytes) == (largest.name, largest.memory_bytes)]
    dropped = [g for g in gpus if g not in keep]
    draft.warnings.append(
        "left out: "
        + ", ".join(f"GPU {g.index} ({g.name}, {g.memory_bytes / GIB:g} GiB)" for g in dropped)
        + f": too small to hold a copy of the model's weights beside the {largest.name}s"
    )
    return keep


def gpu_engine_core_nice(draft: Draft, hardware: Hardware) -> None:
    """Set engine_core_nice: normal priority (the CPU engine's starvation is unmeasured on GPU hosts)."""
    draft.set(
        "engine_core_nice",
        0,
        f"normal priority on this {hardware.node.cpu_cores}-core GPU host: the engine core's busy-wait starved the "
        "API server on a 2-core CPU engine only (BENCHMARKS.md#engine-core-priority-on-cpu); pin 19 if replies "
        "come in bursts",
    )
