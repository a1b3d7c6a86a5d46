"""What the engine will run on: GPUs, their links, CPU and memory, one node or several."""

from __future__ import annotations

from functools import cached_property
from itertools import combinations
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

GIB = 1024**3

LinkKind = Literal["pcie", "nvlink"]

MIN_COMPUTE_CAPABILITY = (7, 5)
"""vLLM 0.24 pins torch 2.11, whose CUDA 13 wheels (and 12.8 ones) hold kernels for Turing (T4) and
newer only (pytorch/pytorch#175253): on a V100 (7.0) or older the first kernel fails with 'no kernel
image is available'."""


class GPUInfo(BaseModel):
    """One GPU as the planner needs it."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0)
    """Index as CUDA numbers it after ``CUDA_VISIBLE_DEVICES`` is applied."""
    name: str
    memory_bytes: int = Field(gt=0)
    free_bytes: int = Field(ge=0)
    """Free memory when detected; other processes' use lowers gpu_memory_utilization."""
    compute_capability: tuple[int, int]
    pcie_gen: int | None = None
    """Current PCIe link generation (idle GPUs may train down; compare with the max)."""
    pcie_width: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    memory_bandwidth_gbs: float | None = Field(default=None, gt=0)
    """Peak memory bandwidth in GB/s (the spec sheet's figure); what a decode step's weight and KV reads
    stream against. None: not known (the performance model then says it assumed one)."""
    bf16_tflops: float | None = Field(default=None, gt=0)
    """Dense tensor-core TFLOP/s at bf16 (fp16 where the GPU has no bf16), from the spec sheet, without
    sparsity; what a prefill computes against. None: not known."""

    @property
    def runs_vllm(self) -> bool:
        """Whether vLLM's CUDA build runs on it (:data:`MIN_COMPUTE_CAPABILITY`)."""
        return self.compute_capability >= MIN_COMPUTE_CAPABILITY

    @property
    def supports_bf16(self) -> bool:
        return self.compute_capability >= (8, 0)


def too_old_for_vllm(gpus: list[GPUInfo] | tuple[GPUInfo, ...]) -> str:
    """'GPU 0 (Tesla K80, cc 3.7), ...: vLLM needs compute capability 7.5 or newer (...)': why the
    planner and set-up pass these GPUs over, in one wording."""
    named = ", ".join(f"GPU {g.index} ({g.name}, cc {'.'.join(map(str, g.compute_capability))})" for g in gpus)
    least = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
    return f"{named}: vLLM needs compute capability {least} or newer (T4, RTX 20xx, A10, L4, A100, H100, ...)"


class NodeInfo(BaseModel):
    """One machine. Several nodes in a ``Hardware`` are identical copies of this."""

    model_config = ConfigDict(frozen=True)

    cpu_cores: int = Field(ge=1)
    memory_bytes: int = Field(gt=0)
    numa_nodes: int = Field(default=1, ge=1)
    cpu_flags: tuple[str, ...] = ()
    """Instruction-set flags that matter to the CPU engine (avx2, avx512f, avx512_bf16, amx_bf16)."""
    gpus: tuple[GPUInfo, ...] = ()
    nvlink_pairs: frozenset[tuple[int, int]] = frozenset()
    """Pairs (i, j), i < j, of GPU indexes joined by NVLink."""
    mps: bool = False
    """NVIDIA's MPS control program (``nvidia-cuda-mps-control``) is here: engines that share a GPU
    can run their kernels at once instead of taking turns."""

    def linked(self, a: int, b: int) -> bool:
        return (min(a, b), max(a, b)) in self.nvlink_pairs

    def all_nvlinked(self, indexes: list[int] | tuple[int, ...]) -> bool:
        """True when every pair among ``indexes`` is joined by NVLink."""
        return all(self.linked(a, b) for a, b in combinations(indexes, 2))


class Hardware(BaseModel):
    """A node description and how many identical nodes there are."""

    model_config = ConfigDict(frozen=True)

    name: str
    source: str
    """'detected' or the profile file it was read from."""
    nodes: int = Field(default=1, ge=1)
    node: NodeInfo
    share: float = Field(default=1.0, gt=0, le=1)
    """The part of each GPU's memory one setup here takes: 1, or 0.5 for each of two setups run side by
    side (``up --compare``, ``config.compare``, which also halves the node's cores and RAM)."""

    @cached_property
    def gpus_per_node(self) -> int:
        return len(self.node.gpus)

    @cached_property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def has_gpu(self) -> bool:
        """Whether a node has a GPU vLLM runs on: with only older ones the CPU engine runs."""
        return any(g.runs_vllm for g in self.node.gpus)

    def link_of(self, indexes: list[int] | tuple[int, ...]) -> LinkKind:
        """The slowest link among a group of GPUs on one node."""
        return "nvlink" if self.node.all_nvlinked(indexes) else "pcie"


CPU_FLAGS_OF_INTEREST = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile"})
"""The flags the CPU engine's kernels choose between; the rest of /proc/cpuinfo is noise."""
