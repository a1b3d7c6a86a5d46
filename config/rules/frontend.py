"""The front end: how many API server processes, and whether vLLM schedules asynchronously.

The host CPU sets the ceiling for small models (API server processes): more of them on hosts
with the cores to spare. The chat page's own stream settings (``app.stream_interval_ms``) are
settings, not plan values, and live in ``config.settings``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.hardware import Hardware
from config.model import ModelSpec
from config.settings import WorkloadSettings

if TYPE_CHECKING:
    from config.planner import Draft

SMALL_MODEL_ACTIVE_PARAMS = 3 * 10**9
"""Below this many active parameters, HTTP and (de)tokenising, not the GPU, set the ceiling."""


def gpu_frontend(draft: Draft, hardware: Hardware, model: ModelSpec, workload: WorkloadSettings, dp: int) -> None:
    """Set api_server_count (one per replica, more for small models on many cores) and async_scheduling."""
    cores = hardware.node.cpu_cores
    small = model.active_param_count < SMALL_MODEL_ACTIVE_PARAMS
    count = dp
    if small and workload.objective != "latency" and cores >= 16 and hardware.nodes == 1:
        count = max(dp, min(4, cores // 4))
    draft.set(
        "api_server_count",
        count,
        f"small model on {cores} cores: HTTP, tokenising and detokenising set the ceiling, so {count} "
        "API server processes (measured 1.3x at 128 concurrent on a 16-core H200 host)"
        if count > dp
        else f"one API server per replica ({dp})",
    )
    draft.set(
        "async_scheduling",
        False,
        "off by default: on a 16-core H200 host it helped at 128 concurrent and hurt at 256; `tune` measures it",
    )


def cpu_frontend(draft: Draft) -> None:
    """Set api_server_count and async_scheduling for the CPU engine."""
    draft.set("api_server_count", 1, "one API server: the CPU engine itself is the bottleneck")
    draft.set("async_scheduling", False, "not supported by the CPU engine")
