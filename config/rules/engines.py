"""How many vLLM servers share each GPU group, and the memory share each one gets.

For a small model on a big GPU the host side (API server, scheduler, detokenising: about one
core per engine core) is the ceiling, not the GPU (about 9 % of its memory bandwidth at 128
concurrent). Measured on one H200 with 16 cores, full-size ERNIE-4.5-0.3B shape, ``vllm bench
serve`` 512 in / 128 out at 256 concurrent (BENCHMARKS.md, "Several engines on one GPU"): one
engine 12-20k output tok/s; two engines of 0.42 of the memory each, behind one endpoint,
31-33k with half the p99 TTFT; through ``serve`` and the router, against ``vllm serve`` defaults
in the same device call (medians of 3 runs), 1.32x / 1.58x at 128 and 1.62x / 2.25x at 256
concurrent in two calls on two hosts, with a quarter to a half of their p99 TTFT (2026-12-02). A
big model keeps one engine per GPU group. Where NVIDIA's MPS is installed the engines run under it
(``gpu_sharing``): 1.12-1.21x the time-sliced pair, and worth sharing from 64 users (2026-12-04).
Under MPS with whole steps as CUDA graphs a third engine joins from 128 users: 1.05-1.15x two on an
H200 and an H100, 1.58-1.71x / 2.55x the defaults at 128 / 256 (2026-12-05).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from config.errors import PlanError
from config.hardware import GPUInfo, Hardware
from config.plan import GIB
from config.rules.memory import CUDA_RUNTIME_RESERVE, DEFAULT_GPU_UTILIZATION
from config.settings import WorkloadSettings

if TYPE_CHECKING:
    from config.planner import Draft

SHARED_GPU_MIN_BYTES = 70 * GIB
"""GPUs this big have room for two or three copies of a small model and their KV caches."""
SHARED_MAX_WEIGHT_BYTES = 4 * GIB
"""Models up to this many bytes of weights per GPU are host-bound on a big GPU."""
CORES_PER_ENGINE = 8
"""Host cores one engine with its API servers keeps busy (16 cores: two engines, measured)."""
MAX_ENGINES_PER_GPU = 2
"""Time-sliced, or under MPS with vLLM's own graphs: three (0.28 of the memory and 2 API servers each)
gave 0.86x / 0.94x the tokens/s of two (4 API servers each) at 128 / 256 concurrent on one 16-core
H200 host: the third engine's host side takes the cores the first two's API servers used. Under MPS
too: three gave 1.13x / 1.79x vLLM's defaults at 128 / 256 (same call), where two gave 1.37x / 2.31x
on another host."""
WHOLE_STEP_MPS_ENGINES = 3
"""Under MPS with whole steps as CUDA graphs: three engines (0.28 of the memory and 2 API servers each
on 16 cores) against two in the same call gave 1.05x / 1.10x the tokens/s at 128 / 256 concurrent on
one H200 (2026-12-05, spreads overlapping) and 1.13x / 1.15x on one H100 (the same day, every
three-engine run at 256 above every two-engine run), p99 TTFT alike: a graphed step costs the host
less, and the GPU, idle 44 % of the time under two engines, has room for a third."""
WHOLE_STEP_MPS_MIN_USERS = 128
"""Users per GPU from which the third engine joins: it was measured at 128 and 256 concurrent only."""
SHARED_UTILIZATION = 0.84
"""The GPU's memory share all engines on it take together (two engines: 0.42 each, measured)."""
SHARED_MIN_USERS = 128
"""Expected users from which engines share a GPU that the driver time-slices. Two engines on one H200
gave 1.32-1.58x and 1.62-2.25x vLLM's defaults at 128 and 256 concurrent, but at 16 they gave 0.72x
one engine direct (4.25k against 5.87k tok/s): two processes time-slice the GPU, and a light load
gains nothing on the host."""
SHARED_MIN_USERS_MPS = 64
"""The same under MPS: two engines against one, same call, medians of 3 (2026-12-04): 0.85x at 16,
0.91x at 32, 1.09x at 64 concurrent (p50 TTFT 0.6x)."""
SHARED_MEASURED = (
    "measured on one H200, 16 cores: 1.32-1.58x / 1.62-2.25x `vllm serve` defaults' tokens/s at 128 / 256 "
    "concurrent (two device calls) "
    "with a quarter to a half of their p99 TTFT, but 0.72x one engine at 16, where two processes time-slicing "
    "the GPU cost more than the host side gains (BENCHMARKS.md)"
)
"""The figures behind both answers of :func:`gpu_engines` for a small model on a big GPU, time-sliced."""
MPS_MEASURED = (
    "measured on one H200, 16 cores, two engines under MPS: 1.12x / 1.21x / 1.14x the time-sliced pair's "
    "tokens/s at 16 / 128 / 256 concurrent (each level's slowest MPS run above the fastest time-sliced one), "
    "0.97-1.37x / 1.56-2.31x `vllm serve` defaults' at 128 / 256 on four hosts with 0.2-0.85x their p99 TTFT, "
    "and against one engine 0.91x at 32, 1.09x at 64 (BENCHMARKS.md)"
)
"""The figures behind MPS: the sharing itself and the lower threshold of users."""
WHOLE_STEP_MPS_MEASURED = (
    "measured under MPS with whole-step graphs, 16 cores, the same call each: three engines 1.05x / 1.10x two's "
    "tokens/s at 128 / 256 concurrent on one H200 and 1.13x / 1.15x on one H100, and 1.58x (H200) and 1.71x / "
    "2.55x (H100) `vllm serve` defaults' at 128 / 256 with about half their p99 TTFT at 128, a quarter at 256 "
    "(BENCHMARKS.md)"
)
"""The figures behind the third engine."""


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
    min_users, measured = (SHARED_MIN_USERS_MPS, MPS_MEASURED) if mps else (SHARED_MIN_USERS, SHARED_MEASURED)
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
            f"one engine per GPU for {per_gpu}: {fit} would share it from {min_users} users per GPU ({measured})",
        )
    elif third and users >= WHOLE_STEP_MPS_MIN_USERS and pinned_share * WHOLE_STEP_MPS_ENGINES <= 0.95:
        n, why = (
            WHOLE_STEP_MPS_ENGINES,
            f"{WHOLE_STEP_MPS_ENGINES} engines per GPU: a {weights / GIB:.2g} GiB model leaves a big GPU mostly "
            f"idle and one engine's host side is the ceiling; under MPS with whole steps as CUDA graphs "
            f"{per_group_cores} cores feed {WHOLE_STEP_MPS_ENGINES} (16 fed three); {WHOLE_STEP_MPS_MEASURED}",
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
            f"{fit} engines per GPU: a {weights / GIB:.2g} GiB model leaves a big GPU mostly idle and one engine's "
            f"host side is the ceiling; {per_group_cores} cores feed {fit} ({CORES_PER_ENGINE} each); "
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
                f"the {engines} engines' kernels run at once through NVIDIA's MPS (a daemon of your own that `serve` "
                f"starts and quits) instead of taking turns; {MPS_MEASURED}",
            )
        )
    return str(
        draft.set(
            "gpu_sharing",
            "time-slice",
            f"the driver time-slices the GPU between the {engines} engines: nvidia-cuda-mps-control, which would "
            f"run them at once, is not installed here ({MPS_MEASURED})",
        )
    )


def share_memory(draft: Draft, engines: int, smallest: GPUInfo, weights: int) -> int:
    """Each engine's gpu_memory_utilization when ``engines`` share a GPU; bytes usable per engine.
    Refuses a split whose share cannot hold the weights and the runtime."""
    if engines == 1:
        return int(smallest.memory_bytes * draft.values["gpu_memory_utilization"])
    share = round(min(DEFAULT_GPU_UTILIZATION, SHARED_UTILIZATION) / engines, 2)
    util = draft.set(
        "gpu_memory_utilization",
        share,
        f"{share} of the GPU for each of the {engines} engines sharing it ({SHARED_UTILIZATION} together, measured)",
    )
    if engines * util > 0.95:
        raise PlanError(
            f"engines_per_gpu={engines} x gpu_memory_utilization={util}: {engines * util:.2f} of the GPU; "
            f"valid: a product of at most 0.95 (e.g. gpu_memory_utilization={round(0.9 / engines, 2)})"
        )
    usable = int(smallest.memory_bytes * util)
    need = weights + CUDA_RUNTIME_RESERVE
    if usable <= need:
        most = max(1, int(smallest.memory_bytes * 0.9 // (need * 1.25)))
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
