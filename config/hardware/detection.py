"""Live detection: this machine's cores, RAM (cgroup limits too), NUMA nodes, CPU flags and GPUs (NVML)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any

from config.errors import HardwareError
from config.hardware import nvml as nv
from config.hardware.types import CPU_FLAGS_OF_INTEREST, GIB, GPUInfo, Hardware, NodeInfo

_PROC_MEMINFO = Path("/proc/meminfo")
_PROC_CPUINFO = Path("/proc/cpuinfo")
MPS_CONTROL = "nvidia-cuda-mps-control"
"""NVIDIA's Multi-Process Service control program, installed with the driver's utilities."""
_SYS_NODES = Path("/sys/devices/system/node")
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def detect() -> Hardware:
    """Inventory this machine, so the planner sizes the engine for what is really here."""
    gpus: tuple[GPUInfo, ...] = ()
    pairs: frozenset[tuple[int, int]] = frozenset()
    nvml, _why_not = nv.load_nvml()
    if nvml is not None:
        try:
            gpus, pairs = read_gpus(nvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
        finally:
            with suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
    node = NodeInfo(
        cpu_cores=cpu_cores(),
        memory_bytes=memory_bytes(),
        numa_nodes=numa_nodes(),
        cpu_flags=cpu_flags(),
        gpus=gpus,
        nvlink_pairs=pairs,
        mps=bool(gpus) and shutil.which(MPS_CONTROL) is not None,
    )
    return Hardware(name=f"this machine: {describe_node(node)}", source="detected", node=node)


def describe_node(node: NodeInfo) -> str:
    """A short human label, e.g. '2x NVIDIA H200' or 'CPU only (8 cores, 32 GiB)'."""
    if not node.gpus:
        return f"CPU only ({node.cpu_cores} cores, {node.memory_bytes / GIB:.0f} GiB)"
    counts: dict[str, int] = {}
    for gpu in node.gpus:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
    return " + ".join(f"{n}x {name}" for name, n in counts.items())


# --------------------------------------------------------------------------- CPU and memory


def cpu_cores() -> int:
    """Cores this process may run on (taskset/cgroup cpusets), not the host's total."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def memory_bytes(meminfo: Path = _PROC_MEMINFO, cgroup_limits: tuple[Path, ...] = _CGROUP_LIMITS) -> int:
    """RAM this process can use: MemTotal, lowered by a container's cgroup limit."""
    total = parse_meminfo(_read_text(meminfo))
    for path in cgroup_limits:
        limit = parse_cgroup_limit(_read_text(path))
        if limit is not None and (total <= 0 or limit < total):
            total = limit
    if total <= 0:
        raise HardwareError(f"cannot read the memory size from {meminfo}; pass --hardware PROFILE")
    return total


def parse_meminfo(text: str) -> int:
    """MemTotal in bytes from /proc/meminfo text; 0 when absent."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemTotal":
            parts = rest.split()
            if parts and parts[0].isdigit():
                unit = parts[1].lower() if len(parts) > 1 else "b"
                return int(parts[0]) * (1024 if unit == "kb" else 1)
    return 0


def parse_cgroup_limit(text: str) -> int | None:
    """A cgroup memory limit in bytes; None for 'max', empty or unreadable."""
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def numa_nodes(sys_nodes: Path = _SYS_NODES) -> int:
    """NUMA node count; 1 where sysfs does not say (containers without /sys)."""
    try:
        found = sum(1 for p in sys_nodes.glob("node[0-9]*") if p.name[4:].isdigit())
    except OSError:
        found = 0
    return max(1, found)


def cpu_flags(cpuinfo: Path = _PROC_CPUINFO) -> tuple[str, ...]:
    """The instruction-set flags of this CPU that matter to the CPU engine."""
    return parse_cpu_flags(_read_text(cpuinfo))


def parse_cpu_flags(text: str) -> tuple[str, ...]:
    """Filter the first 'flags' line of /proc/cpuinfo to the flags of interest, sorted."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "flags":
            return tuple(sorted(CPU_FLAGS_OF_INTEREST.intersection(rest.split())))
    return ()


def _read_text(path: Path) -> str:
    """File text, or '' when it is missing or unreadable (not every box has every file)."""
    try:
        return path.read_text()
    except OSError:
        return ""


# --------------------------------------------------------------------------- GPUs


def read_gpus(nvml: Any, cuda_visible_devices: str | None) -> tuple[tuple[GPUInfo, ...], frozenset[tuple[int, int]]]:
    """Visible GPUs (CUDA-indexed) and their NVLink pairs from an initialised pynvml."""
    try:
        handles, uuids = nv.device_handles(nvml)
    except nvml.NVMLError as exc:
        raise HardwareError(f"NVML cannot list the GPUs: {exc}; check nvidia-smi") from exc
    visible = nv.visible_indexes(cuda_visible_devices, uuids)
    gpus = tuple(_read_gpu(nvml, handles[n], cuda_index) for cuda_index, n in enumerate(visible))
    bus_ids = [nv.bus_id(nvml, h) for h in handles]
    remotes: dict[int, Iterable[str]] = {n: nv.nvlink_remotes(nvml, handles[n]) for n in visible}
    pairs = set(nv.nvlink_pairs_from_remotes(bus_ids, remotes))
    pairs |= nv.p2p_nvlink_pairs(nvml, handles, visible)
    return gpus, nv.reindex_pairs(pairs, visible)


def _read_gpu(nvml: Any, handle: Any, cuda_index: int) -> GPUInfo:
    """One GPU's planner-relevant facts; a GPU without name/memory/capability is an error."""
    try:
        name = nv.text(nvml.nvmlDeviceGetName(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    except nvml.NVMLError as exc:
        raise HardwareError(
            f"NVML cannot read GPU {cuda_index}: {exc}; check nvidia-smi or pass --hardware PROFILE"
        ) from exc
    pcie = nv.pcie_link(nvml, handle)
    return GPUInfo(
        index=cuda_index,
        name=name,
        memory_bytes=int(memory.total),
        free_bytes=int(memory.free),
        compute_capability=(int(major), int(minor)),
        pcie_gen=pcie.gen,
        pcie_width=pcie.width,
        pcie_gen_max=pcie.gen_max,
        pcie_width_max=pcie.width_max,
    )
