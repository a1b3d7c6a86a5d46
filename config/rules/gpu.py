"""The GPU engine's path: which GPUs, and the steps that hand one rule's results to the next.

``config.rules.order`` lists the steps in the order they run; each reads the ``GpuWork`` fields
earlier steps wrote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from config.draft import Draft, Work
from config.hardware import GPUInfo, Hardware, too_old_for_vllm
from config.model import ModelSpec
from config.plan import GIB, Memory
from config.rules.batching import gpu_max_num_batched_tokens, gpu_max_num_seqs, prefill_chunk
from config.rules.dtype import as_served, gpu_dtype
from config.rules.engines import gpu_engines, gpu_sharing, share_memory
from config.rules.frontend import gpu_frontend
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

PREFILL_GUESS = 8192
"""max_num_batched_tokens the parallel sizes are chosen at, unless pinned."""
SEQS_GUESS = 256
"""max_num_seqs the parallel sizes and the activation reserve are sized for, unless pinned."""


@dataclass(eq=False, repr=False)
class GpuWork(Work):
    """What the GPU steps hand each other beside the plan's own values; per GPU unless said."""

    gpus: list[GPUInfo] = field(init=False)
    """The node's GPUs the plan uses."""
    usable: int = field(init=False)
    """Bytes one engine may take of the smallest GPU."""
    tp: int = field(init=False)
    pp: int = field(init=False)
    dp: int = field(init=False)
    nodes: int = field(init=False)
    """Nodes whose replicas share the users; 1 when one engine spans the nodes."""
    weights: int = field(init=False)
    engines: int = field(init=False)
    """Engines sharing each GPU group."""
    chunk: int = field(init=False)
    chunk_reason: str = field(init=False)
    reserve: int = field(init=False)
    kv_tokens: int = field(init=False)
    max_len: int = field(init=False)
    seqs: int = field(init=False)
    max_num_batched_tokens: int = field(init=False)

    @property
    def smallest(self) -> GPUInfo:
        return min(self.gpus, key=lambda g: g.memory_bytes)

    @property
    def seqs_fit(self) -> int:
        """Typical requests the KV cache holds at once, per replica."""
        return max(1, self.kv_tokens // self.typical)


def use_gpus(work: GpuWork) -> None:
    """The GPUs vLLM runs on, and the nodes (one-node plans on each, until a split says otherwise)."""
    work.gpus = select_gpus(work.draft, work.hardware, work.model)
    work.draft.values["gpus"] = [g.index for g in work.gpus]
    work.draft.values["nodes"] = work.hardware.nodes


def set_dtype(work: GpuWork) -> None:
    work.model = as_served(work.model, gpu_dtype(work.draft, work.gpus, work.model))


def set_utilization(work: GpuWork) -> None:
    """Utilisation comes first: everything else is sized from what it leaves."""
    work.usable = gpu_utilization(work.draft, work.gpus, work.smallest, work.hardware.share)


def set_parallel(work: GpuWork) -> None:
    """TP and PP at the context and batch sizes pinned, else at a first guess of them."""
    pins = work.draft.pins
    min_tokens = pins.get("max_model_len", work.workload.context or MIN_CONTEXT)
    mnbt_guess = pins.get("max_num_batched_tokens", PREFILL_GUESS)
    seqs_guess = pins.get("max_num_seqs", SEQS_GUESS)
    work.tp, work.pp = choose_parallel(
        work.draft, work.hardware, work.model, work.workload, work.usable, work.gpus, mnbt_guess, seqs_guess, min_tokens
    )


def set_replicas(work: GpuWork) -> None:
    gpn = len(work.gpus)
    work.dp = choose_replicas(work.draft, work.hardware, work.tp, work.pp, gpn)
    # replicas on every node share the users
    work.nodes = work.draft.values["nodes"] if work.tp * work.pp <= gpn else 1


def set_engines(work: GpuWork) -> None:
    """Engines per GPU group; they hang on whether whole steps will be graphed (``whole_step_graphs``)."""
    whole_steps = whole_step_graphs(work.draft, work.gpus, work.model)
    work.weights = weights_per_gpu(work.model, work.tp, work.pp)
    work.engines = gpu_engines(
        work.draft,
        work.hardware,
        work.workload,
        work.weights,
        work.tp * work.pp,
        work.dp,
        work.nodes,
        work.smallest,
        whole_steps,
    )


def set_sharing(work: GpuWork) -> None:
    """How engines share a GPU, and each one's share of its memory."""
    gpu_sharing(work.draft, work.hardware, work.engines)
    if work.engines > 1:
        work.usable = share_memory(work.draft, work.engines, work.smallest, work.weights, work.hardware.share)


def size_kv_cache(work: GpuWork) -> None:
    """The memory arithmetic at the chosen split, per engine: the prefill chunk, reserve and KV tokens."""
    work.chunk, work.chunk_reason = prefill_chunk(work.workload.objective, work.smallest)
    pins = work.draft.pins
    mnbt = pins.get("max_num_batched_tokens", work.chunk)
    seqs = pins.get("max_num_seqs", SEQS_GUESS)
    work.reserve = gpu_reserve(work.model, work.tp, work.pp, mnbt, seqs)
    work.kv_tokens = kv_tokens(work.model, work.tp, work.pp, work.usable, mnbt, seqs)


def set_max_model_len(work: GpuWork) -> None:
    work.max_len = choose_max_len(work.draft, work.model, work.workload, work.kv_tokens, "the KV cache")


def set_max_num_seqs(work: GpuWork) -> None:
    replicas = work.dp * work.engines
    users_per_replica = math.ceil(work.workload.users / (replicas * work.nodes))
    work.seqs = gpu_max_num_seqs(work.draft, work.workload, work.seqs_fit, replicas, users_per_replica)


def set_max_num_batched_tokens(work: GpuWork) -> None:
    """The prefill chunk, at least max_num_seqs (a pin, if any, wins)."""
    work.max_num_batched_tokens = gpu_max_num_batched_tokens(work.draft, work.chunk, work.seqs, work.chunk_reason)


def set_graphs(work: GpuWork) -> None:
    gpu_graphs(work.draft, work.gpus, work.model, work.max_num_batched_tokens)


def set_frontend(work: GpuWork) -> None:
    routed = work.engines > 1 or work.nodes > 1
    gpu_frontend(work.draft, work.hardware, work.model, work.workload, work.dp, work.engines, routed=routed)


def add_memory(work: GpuWork) -> None:
    """The memory arithmetic behind the plan, per GPU."""
    work.memory = Memory(
        device_bytes=work.smallest.memory_bytes,
        usable_bytes=work.usable,
        weights_bytes=work.weights,
        reserve_bytes=work.reserve,
        kv_budget_bytes=max(work.usable - work.weights - work.reserve, 0),
        kv_bytes_per_token=work.model.kv_bytes_per_token(work.tp, work.pp),
        kv_tokens=work.kv_tokens,
        max_model_len=work.max_len,
        concurrency_at_max_len=work.kv_tokens / work.max_len,
        typical_seq_tokens=work.typical,
        seqs_at_typical_len=work.seqs_fit,
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


def set_engine_core_nice(work: Work) -> None:
    """Set engine_core_nice: normal priority (the CPU engine's starvation is unmeasured on GPU hosts)."""
    work.draft.set(
        "engine_core_nice",
        0,
        f"normal priority on this {work.hardware.node.cpu_cores}-core GPU host: the engine core's busy-wait starved "
        "the API server on a 2-core CPU engine only (BENCHMARKS.md#engine-core-priority-on-cpu); pin 19 if replies "
        "come in bursts",
    )


def fix_kv_cache(work: GpuWork) -> None:
    """Engines sharing a GPU: each one's KV cache fixed from this arithmetic, not measured by vLLM at
    start (its measurement counts what the others allocate meanwhile), so all of them start at once."""
    if work.engines == 1:
        return
    kv = work.memory.kv_budget_bytes
    work.draft.set(
        "kv_cache_memory_bytes",
        kv,
        f"{kv / GIB:.2f} GiB of KV cache for each of the {work.engines} engines sharing a GPU, fixed so that "
        "they start together, none measuring the others' memory as its own (BENCHMARKS.md#start-up-and-warm-up)",
    )
