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


def host_bound(model: ModelSpec) -> bool:
    """A small model: its steps are short, so the host side (HTTP, tokenising, launching kernels) is the ceiling."""
    return model.active_param_count < SMALL_MODEL_ACTIVE_PARAMS


ASYNC_EXECUTORS = ("uni", "mp")
"""vLLM's executors that schedule asynchronously (``supports_async_scheduling`` in vLLM 0.24; Ray's does not)."""
PAGE_USERS_PER_PROCESS = 16
"""Chats one page process sets up in time: at 16 at once its first-token cost was floor + 6 ms."""


def gpu_frontend(
    draft: Draft,
    hardware: Hardware,
    model: ModelSpec,
    workload: WorkloadSettings,
    dp: int,
    engines: int = 1,
    *,
    routed: bool = False,
) -> None:
    """Set api_server_count (per server: one per replica, more for small models on many cores),
    stream_interval and async_scheduling. ``engines``: servers per GPU group behind the router;
    ``routed``: one server per GPU group (and share) behind the router, as on several nodes."""
    cores = hardware.node.cpu_cores
    small = host_bound(model)
    if routed:
        per_engine = cores // (dp * engines)
        count = max(1, min(4, per_engine // 2))
        reason = (
            f"{count} API server processes for each of the {dp * engines} engines: {per_engine} cores each, half "
            "of them, rounded down, at most 4 (measured on a 16-core H200 host, 2 engines: 4 each gave 1.08x at 128 "
            "and 1.14x at 256 concurrent over 3 each)"
        )
    else:
        count = dp
        reason = f"one API server per replica ({dp})"
        if small and workload.objective != "latency" and cores >= 16 and hardware.nodes == 1:
            count = max(dp, min(4, cores // 4))
            reason = (
                f"small model on {cores} cores: HTTP, tokenising and detokenising set the ceiling, so {count} "
                "API server processes (measured 1.3x at 128 concurrent on a 16-core H200 host)"
            )
    draft.set("api_server_count", count, reason)
    interval = 16 if small else 1
    draft.set(
        "stream_interval",
        interval,
        "16 tokens per streamed chunk: a small model's tokens come faster than one API server can send them one "
        "by one (measured with 16: 1.3-1.6x tokens/s at 256 concurrent on one H200); the page joins chunks "
        "every 30 ms anyway"
        if interval > 1
        else "every token as it comes: a big model's tokens are slow enough to send one by one",
    )
    backend = draft.values["distributed_executor_backend"]  # set by the parallel rules before this one
    if backend in ASYNC_EXECUTORS:
        draft.set(
            "async_scheduling",
            True,
            "the next step is scheduled while the GPU runs this one (measured off on one H200, two engines: "
            "0.78x / 0.88x the tokens/s at 128 / 256 concurrent, medians of 3); vLLM (0.24) turns it on by itself "
            "with this executor, so it is passed explicitly to make the plan what runs; `tune` measures it off",
        )
    else:
        draft.set("async_scheduling", False, f"the {backend} executor does not schedule asynchronously")


def page_processes(draft: Draft, hardware: Hardware, model: ModelSpec, workload: WorkloadSettings) -> None:
    """Set page_processes: one Chainlit event loop sets up every message of the page, so a small
    model's many concurrent chats on a GPU host need several (cores to spare: a quarter of them)."""
    cores = hardware.node.cpu_cores
    small = host_bound(model)
    if hardware.has_gpu and small and workload.users >= PAGE_USERS_PER_PROCESS * 2 and cores >= 8:
        count = max(2, min(4, cores // 4, workload.users // PAGE_USERS_PER_PROCESS))
        draft.set(
            "page_processes",
            count,
            f"{workload.users} users of a small model on {cores} cores: one page process sets up every message on "
            f"one event loop (about 10 ms of CPU each on an H200 host: 64 chats at once wait ~300 ms for it), so "
            f"{count} page processes, each client address on one",
        )
    else:
        draft.set(
            "page_processes",
            1,
            "one page process: the engine, not the page's event loop, is the ceiling at this load"
            if not hardware.has_gpu or not small
            else f"one page process: {workload.users} users fit one event loop",
        )


def cpu_frontend(draft: Draft) -> None:
    """Set api_server_count and async_scheduling for the CPU engine."""
    draft.set("api_server_count", 1, "one API server: the CPU engine itself is the bottleneck")
    draft.set("async_scheduling", False, "not supported by the CPU engine")
    draft.set("stream_interval", 1, "every token as it comes: the CPU engine is slower than its API server")
