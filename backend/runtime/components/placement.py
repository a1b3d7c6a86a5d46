"""Where a plan's servers go on this node: their ports, checked free before anything starts, and
each engine's command line, environment and log.

``serve`` makes every engine here before it starts one, so a port the plan needs that is taken
(another engine, the chat page's own ``--port``) is refused with the fix, not met half-way.
"""

from __future__ import annotations

import os
from pathlib import Path

from backend.errors import PlanError
from backend.runtime.components.engines import Engine, compile_cache_env
from backend.runtime.multinode.node_identity import core_share, resolves_to_loopback
from backend.runtime.processes.process import IN_USE, bind_problem
from config.commands import engine_command, plan_ports, server_port
from config.hardware import Hardware
from config.plan import Plan
from config.settings import EngineSettings


def check_ports(plan: Plan, host: str, engine_port: int, page_port: int | None, node_rank: int) -> None:
    """PlanError when a port the plan's servers need is the chat page's or already in use; engine.port
    itself is checked before planning. A worker node runs only its engines (no router, no metrics)."""
    taken = plan_ports(plan, engine_port)
    if page_port in taken:
        needs = f"engine.port {taken[0]} and the {len(taken) - 1} after it" if len(taken) > 1 else "engine.port"
        outside = f"--port outside {taken[0]}-{taken[-1]}" if len(taken) > 1 else "another --port"
        raise PlanError(
            f"the chat page's port {page_port} is one the engines need ({needs}); "
            f"choose {outside} or another --engine-port"
        )
    if node_rank:
        mine = [server_port(plan, taken[0], i) for i in range(plan.engine_count)]
        if held := [p for p in mine if bind_problem(host, p) == IN_USE]:
            raise PlanError(
                f"port {held[0]} on {host}, where this node's engine {mine.index(held[0])} would listen (from "
                f"--engine-port {taken[0]}), is already in use (another engine?); stop it or choose another "
                "--engine-port on this node"
            )
    elif held := [p for p in taken[1:] if bind_problem(host, p) == IN_USE]:
        raise PlanError(
            f"port {held[0]} on {host}, one of the {len(taken)} from engine.port {taken[0]} the plan's "
            "engines and router listen on, is already in use (another engine?); stop it or choose another "
            "--engine-port"
        )


def plan_engines(
    plan: Plan,
    engine: EngineSettings,
    hardware: Hardware,
    model_path: str,
    run_dir: Path,
    log_path: Path,
    *,
    node_rank: int,
    master_addr: str,
    master_port: int,
    mps_env: dict[str, str] | None,
) -> list[Engine]:
    """The plan's servers: one on the engine port, or one per GPU group and share behind the router.
    ``log_path``: the one engine's log (a routed plan's engines log to ``engine-N.log``)."""
    outer = os.environ.get("CUDA_VISIBLE_DEVICES")
    out = []
    for i in range(plan.engine_count):
        argv, env = engine_command(
            plan,
            i,
            python=engine.python,
            model_path=model_path,
            host=engine.host,
            port=engine.port,
            all_gpus=hardware.gpus_per_node,
            cores=hardware.node.cpu_cores,
            extra_args=engine.extra_args,
            outer_visible=outer,
            master_addr=master_addr,
            master_port=master_port,
        )
        auto_bind = env.get("VLLM_CPU_OMP_THREADS_BIND") == "auto"
        if plan.split_across_nodes and auto_bind and resolves_to_loopback(env["VLLM_HOST_IP"]):
            env["VLLM_CPU_OMP_THREADS_BIND"] = core_share(0, plan.nodes) or "auto"  # every stage on this machine
        if engine.api_key:
            env["VLLM_API_KEY"] = engine.api_key
        env.update(mps_env or {})
        if plan.engine_count > 1:  # they may start together (start_waves), CPU engines always do
            env.update(compile_cache_env(i, os.environ))
        name, log = (f"engine {i}", run_dir / f"engine-{i}.log") if plan.routed else ("engine", log_path)
        if node_rank:
            name = f"node {node_rank} {name}"
        out.append(Engine(name, argv, env, log, run_dir, engine.host, server_port(plan, engine.port, i)))
    return out
