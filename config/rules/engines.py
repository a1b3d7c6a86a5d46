"""How many vLLM servers share each GPU group, and the memory share each one gets.

For a small model on a big GPU the host side (API server, scheduler, detokenising: about one core
per engine core) is the ceiling, not the GPU, so several engines share the GPU under heavy load,
behind the router (BENCHMARKS.md#engines-per-gpu); under NVIDIA's MPS where it is installed
(BENCHMARKS.md#mps); three under MPS with whole-step CUDA graphs (BENCHMARKS.md#three-engines-per-gpu).
A big model keeps one engine per GPU group.
"""

from __future__ import annotations

import math

from config.draft import Draft
from config.errors import PlanError
from config.hardware import GPUInfo, Hardware
from config.plan import GIB
from config.rules.memory import CUDA_RUNTIME_RESERVE, DEFAULT_GPU_UTILIZATION
from config.settings import WorkloadSettings

SHARED_GPU_MIN_BYTES = 70 * GIB
"""GPUs this big have room for two or three copies of a small model and their KV caches."""
SHARED_MAX_WEIGHT_BYTES = 4 * GIB
"""Models up to this many bytes of weights per GPU are host-bound on a big GPU."""
CORES_PER_ENGINE = 8
"""Host cores one engine with its API servers keeps busy (BENCHMARKS.md#engines-per-gpu)."""
MAX_ENGINES_PER_GPU = 2
"""Engines per GPU time-sliced, or under MPS with vLLM's own graphs: a third took the cores the first two's
API servers used (BENCHMARKS.md#three-engines-per-gpu)."""
WHOLE_STEP_MPS_ENGINES = 3
"""Engines per GPU under MPS with whole-step CUDA graphs: a graphed step costs the host less, and the GPU,
idle 44 % of the time under two engines, has room for a third (BENCHMARKS.md#three-engines-per-gpu)."""
WHOLE_STEP_MPS_MIN_USERS = 128
"""Users per GPU from which the third engine joins: it was measured at 128 and 256 users only
(BENCHMARKS.md#three-engines-per-gpu)."""
SHARED_UTILIZATION = 0.84
"""The GPU's memory share all engines on it take together: 0.42 each for two (BENCHMARKS.md#engines-per-gpu)."""
SHARED_MIN_USERS = 128
"""Users per GPU from which engines share a GPU that the driver time-slices: below, a light load gains
nothing on the host and the engines wait for each other's turn (BENCHMARKS.md#engines-per-gpu)."""
SHARED_MIN_USERS_MPS = 64
"""Users per GPU from which engines share a GPU under MPS (BENCHMARKS.md#mps)."""
SHARED_MEASURED = "two time-sliced engines gave 0.72x one at 16 users, 1.58x / 2.25x `vllm serve` at 128 / 256"
"""The figure behind sharing a time-sliced GPU, or not (BENCHMARKS.md#engines-per-gpu)."""
MPS_MEASURED = "under MPS two engines gave 0.91x one at 32 users, 1.09x at 64"
"""The figure behind sharing a GPU under MPS, or not (BENCHMARKS.md#mps)."""
MPS_GAIN = "1.12-1.21x the tokens/s of the same engines time-sliced (BENCHMARKS.md#mps)"
"""The figure behind MPS itself."""
WHOLE_STEP_MPS_MEASURED = (
    "under MPS with whole-step graphs three gave 1.05-1.15x the tokens/s of two at 128 and 256 users "
    "(BENCHMARKS.md#three-engines-per-gpu)"
)
"""The figure behind the third engine."""


def uses_mps(draft: Draft, hardware: Hardware) -> bool:
    """Whether engines sharing a GPU would run under MPS: pinned, else where its program is installed."""
    pinned = draft.pins.get("gpu_sharing")
    return pinned == "mps" if pinned else hardware.node.mps


def gpu_engines(
    draft: Draft,
    hardware: Hardware,
    workload: WorkloadSettings,
    weights: int,
    world: int,
    groups: int,
    nodes: int,
    smallest: GPUInfo,
    whole_steps: bool,
) -> int:
    """Set engines_per_gpu for a GPU plan: two on a big GPU for a small model under heavy load
    when the host has the cores for them, three under MPS with whole-step graphs (``whole_steps``)
    from 128 users, else one. ``groups``: GPU groups on a node; ``nodes``: the nodes whose groups
    share the users (each node running its own replicas), else 1."""
    cores = hardware.node.cpu_cores
    mps = uses_mps(draft, hardware)
    min_users, measured = (
        (SHARED_MIN_USERS_MPS, f"{MPS_MEASURED} (BENCHMARKS.md#mps)")
        if mps
        else (SHARED_MIN_USERS, f"{SHARED_MEASURED} (BENCHMARKS.md#engines-per-gpu)")
    )
    per_group_cores = cores // max(groups, 1)
    # The thresholds were measured as load on one GPU; the users are spread over every GPU group.
    all_groups = max(groups, 1) * nodes
    users = math.ceil(workload.users / all_groups)
    per_gpu = f"{users} users per GPU ({workload.users} over {all_groups} GPUs)" if all_groups > 1 else f"{users} users"
    fit = min(MAX_ENGINES_PER_GPU, per_group_cores // CORES_PER_ENGINE)
    pinned_share = draft.pins.get("gpu_memory_utilization", 0)
    # The 16 cores two engines need fed three (measured); a host with fewer shares no GPU.
    third = mps and whole_steps
    if world > 1:
        n, why = 1, "one engine per GPU group: the group's GPUs are joined by TP/PP"
    elif smallest.memory_bytes < SHARED_GPU_MIN_BYTES:
        n, why = 1, f"one engine per GPU: {smallest.memory_bytes / GIB:.0f} GiB holds one copy with room for its KV"
    elif weights > SHARED_MAX_WEIGHT_BYTES:
        n, why = 1, f"one engine per GPU: {weights / GIB:.1f} GiB of weights keep the GPU itself busy"
    elif pinned_share * 2 > 0.95:
        n, why = 1, f"one engine per GPU: you pinned gpu_memory_utilization={pinned_share}"
    elif fit < 2:
        n, why = (
            1,
            f"one engine per GPU: {per_group_cores} host cores per GPU feed one engine ({CORES_PER_ENGINE} each)",
        )
    elif users < min_users:
        n, why = (
            1,
            f"one engine per GPU for {per_gpu}: {fit} would share it from {min_users} users per GPU; {measured}",
        )
    elif third and users >= WHOLE_STEP_MPS_MIN_USERS and pinned_share * WHOLE_STEP_MPS_ENGINES <= 0.95:
        n, why = (
            WHOLE_STEP_MPS_ENGINES,
            f"{WHOLE_STEP_MPS_ENGINES} engines per GPU for {per_gpu}: {WHOLE_STEP_MPS_MEASURED}",
        )
    else:
        if not third:
            later = ""
        elif users < WHOLE_STEP_MPS_MIN_USERS:
            later = f"; a third joins from {WHOLE_STEP_MPS_MIN_USERS} users per GPU ({users} here)"
        else:
            later = f"; a third would join, but you pinned gpu_memory_utilization={pinned_share} (x3 > 0.95)"
        n, why = (
            fit,
            f"{fit} engines per GPU for {per_gpu}, {CORES_PER_ENGINE} of the {per_group_cores} cores each: "
            f"{measured}{later}",
        )
    return int(draft.set("engines_per_gpu", n, why))


def gpu_sharing(draft: Draft, hardware: Hardware, engines: int) -> str:
    """Set gpu_sharing: how the engines on one GPU take turns on it."""
    if engines == 1:
        return str(draft.set("gpu_sharing", "time-slice", "one engine per GPU: nothing to share"))
    if hardware.node.mps:
        return str(
            draft.set(
                "gpu_sharing",
                "mps",
                f"the {engines} engines' kernels run at once under NVIDIA's MPS (a daemon `serve` starts and quits): "
                f"{MPS_GAIN}",
            )
        )
    return str(
        draft.set(
            "gpu_sharing",
            "time-slice",
            f"the driver time-slices the GPU between the {engines} engines: nvidia-cuda-mps-control is not installed "
            f"here (MPS gave {MPS_GAIN})",
        )
    )


def share_memory(draft: Draft, engines: int, smallest: GPUInfo, weights: int, setup_share: float = 1.0) -> int:
    """Each engine's gpu_memory_utilization when ``engines`` share a GPU; bytes usable per engine.
    ``setup_share``: the part of the GPU this setup takes beside a compared one (``Hardware.share``).
    Refuses a split whose share cannot hold the weights and the runtime."""
    if engines == 1:
        return int(smallest.memory_bytes * draft.values["gpu_memory_utilization"])
    together = round(min(DEFAULT_GPU_UTILIZATION, SHARED_UTILIZATION) * setup_share, 2)
    share = round(together / engines, 2)
    beside = f" ({setup_share:.0%} of {SHARED_UTILIZATION}: a compared setup takes the rest)" if setup_share < 1 else ""
    util = draft.set(
        "gpu_memory_utilization",
        share,
        f"{share} of the GPU for each of the {engines} engines sharing it, {together} together{beside} "
        "(BENCHMARKS.md#engines-per-gpu)",
    )
    if engines * util > 0.95:
        raise PlanError(
            f"engines_per_gpu={engines} x gpu_memory_utilization={util}: {engines * util:.2f} of the GPU; "
            f"valid: a product of at most 0.95 (e.g. gpu_memory_utilization={round(0.9 / engines, 2)})"
        )
    usable = int(smallest.memory_bytes * util)
    need = weights + CUDA_RUNTIME_RESERVE
    if usable <= need:
        most = max(1, int(smallest.memory_bytes * 0.9 * setup_share // (need * 1.25)))
        raise PlanError(
            f"engines_per_gpu={engines}: each engine gets {usable / GIB:.1f} GiB of the {smallest.name}, and the "
            f"model needs {need / GIB:.1f} GiB before any KV cache; valid on this hardware: 1..{most}"
        )
    return usable


def cpu_engines(draft: Draft, hardware: Hardware, weights: int, kv_bytes: int) -> int:
    """Set engines_per_gpu for a CPU plan: one (the CPU engine itself is the ceiling); pinned to
    more, each takes its own cores and KV cache, and all must fit in RAM."""
    n = int(draft.set("engines_per_gpu", 1, "one CPU engine: it keeps every core busy by itself"))
    draft.set("gpu_sharing", "time-slice", "no GPU to share")
    node = hardware.node
    if n > node.cpu_cores:
        raise PlanError(f"engines_per_gpu={n}: each CPU engine needs a core of its own; valid: 1..{node.cpu_cores}")
    need = n * (weights + kv_bytes)
    if need > node.memory_bytes * 0.9:
        raise PlanError(
            f"engines_per_gpu={n}: {n} copies of the weights and KV caches need {need / GIB:.1f} GiB, "
            f"and this machine has {node.memory_bytes / GIB:.1f} GiB"
        )
    return n
