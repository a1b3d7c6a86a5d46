"""What the engine will run on: GPUs, their links, CPU and memory, one node or several.

- ``types``: the ``Hardware`` / ``NodeInfo`` / ``GPUInfo`` models the planner reads.
- ``detection``: this machine, live (/proc, cgroup limits, sysfs, NVML).
- ``profiles``: TOML profiles (shipped in ``config/profiles``), ``resolve_hardware``.
- ``nvml``: pynvml helpers shared with ``verify`` (loading, index mapping, links).
"""

from config.hardware.detection import (
    cpu_cores,
    cpu_flags,
    describe_node,
    detect,
    memory_bytes,
    numa_nodes,
    parse_cgroup_limit,
    parse_cpu_flags,
    parse_meminfo,
    read_gpus,
)
from config.hardware.nvml import (
    load_nvml,
    normalize_bus_id,
    nvlink_pairs_from_remotes,
    reindex_pairs,
    visible_indexes,
)
from config.hardware.profiles import PROFILE_DIR, list_profiles, load_profile, resolve_hardware
from config.hardware.types import (
    CPU_FLAGS_OF_INTEREST,
    GIB,
    GPUInfo,
    Hardware,
    LinkKind,
    NodeInfo,
    too_old_for_vllm,
)

__all__ = [
    "CPU_FLAGS_OF_INTEREST",
    "GIB",
    "PROFILE_DIR",
    "GPUInfo",
    "Hardware",
    "LinkKind",
    "NodeInfo",
    "cpu_cores",
    "cpu_flags",
    "describe_node",
    "detect",
    "list_profiles",
    "load_nvml",
    "load_profile",
    "memory_bytes",
    "normalize_bus_id",
    "numa_nodes",
    "nvlink_pairs_from_remotes",
    "parse_cgroup_limit",
    "parse_cpu_flags",
    "parse_meminfo",
    "read_gpus",
    "reindex_pairs",
    "resolve_hardware",
    "too_old_for_vllm",
    "visible_indexes",
]
