"""Several nodes: the Ray head on this machine, the exact line for each worker, wait for them.

vLLM spans nodes through Ray (TP inside a node, one pipeline stage per node). ``serve`` on the
head starts Ray here, prints what to run on every other node with this node's address filled
in, and launches vLLM only once every node has joined.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from backend.runtime.process import EngineProcess, EngineStartError
from config.commands import HEAD_ADDRESS, RAY_PORT
from config.plan import Plan

JOIN_POLL_S = 3.0


def head_ip() -> str:
    """This node's address as other nodes would reach it (hostname lookup; no traffic sent)."""
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
    return ip


def has_ray(python: str) -> bool:
    done = subprocess.run([python, "-c", "import ray"], capture_output=True, timeout=120, check=False)
    return done.returncode == 0


def worker_lines(plan: Plan, ip: str) -> list[str]:
    """The plan's ray-worker commands with the head's real address."""
    return [c.shell().replace(HEAD_ADDRESS, ip) for c in plan.commands if c.role == "ray-worker"]


def alive_nodes(python: str, address: str) -> int:
    code = (
        f"import ray; ray.init(address={address!r}, logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    try:
        return int(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


class RayHead:
    """``ray start --head --block`` as a child in its own process group."""

    def __init__(self, python: str, plan: Plan, run_dir: Path) -> None:
        self.python = python
        self.plan = plan
        self.ip = head_ip()
        self.address = f"{self.ip}:{RAY_PORT}"
        gpus = len(plan.gpus)
        argv = [python, "-m", "ray.scripts.scripts", "start", "--head", f"--port={RAY_PORT}", f"--num-gpus={gpus}"]
        self.process = EngineProcess([*argv, "--block"], {}, run_dir / "ray-head.log", cwd=run_dir)

    def start(self) -> None:
        if not has_ray(self.python):
            raise EngineStartError(
                f"this plan spans {self.plan.nodes} nodes and needs Ray in the engine's environment "
                f"({self.python}): install it there (pip install 'ray[default]'), or plan for one node "
                "(--hardware with one node)"
            )
        self.process.start()

    def wait_for_workers(self, timeout_s: float, progress: Callable[[str], None]) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.exit_code() is not None:
                raise EngineStartError(
                    f"the Ray head exited (code {self.process.exit_code()}); see {self.process.log_path}"
                )
            joined = alive_nodes(self.python, self.address)
            if joined >= self.plan.nodes:
                return
            progress(f"Ray: {joined} of {self.plan.nodes} nodes joined; waiting for the workers")
            time.sleep(JOIN_POLL_S)
        raise EngineStartError(
            f"only some of the {self.plan.nodes} nodes joined the Ray cluster at {self.address} within "
            f"{timeout_s:.0f} s; run the worker line on every other node and check the network between them"
        )

    def stop(self) -> None:
        self.process.stop()
