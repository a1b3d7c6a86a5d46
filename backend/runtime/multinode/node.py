"""``serve --node-rank N --head ADDRESS``: a worker node's side of a multi-node plan.

It asks the head what it serves, resolves the same model here, joins with its vLLM version and
model fingerprint (refused on a difference), takes the head's plan, and runs its part:

- replicas: this node's engines, as ``serve`` runs them on one machine (started, warmed,
  restarted when one dies), listening on the address the head reaches; their URLs go to the
  head, whose router lists them;
- split: this node's pipeline stage, ``vllm serve --headless`` with vLLM's multi-node flags.

A beat goes to the head every second from a thread of its own, so a long start-up is never
taken for silence. When the head stops (Ctrl-C there) or has not answered for a while, this
node stops its part; nothing is left running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from pydantic import ValidationError

from backend.errors import ErniechatError, NodeError
from backend.runtime.components.engines import Engine
from backend.runtime.multinode.cluster import (
    BEAT_S,
    HEAD_LOST_S,
    Beat,
    BeatReply,
    Hello,
    JoinReply,
    JoinRequest,
    NodeState,
    Refused,
)
from backend.runtime.multinode.node_identity import (
    core_share,
    ip_towards,
    model_fingerprint,
    parse_head,
    resolves_to_loopback,
    vllm_version,
)
from backend.runtime.processes.leftovers import stop_leftovers
from backend.runtime.resolve import resolve_model
from config.commands import refuse_eager_cpu_pipeline, with_extra_args, worker_argv
from config.pipeline import planned_as_given
from config.settings import Settings, is_loopback

HELLO_POLL_S = 1.0


class HeadLink:
    """This node's HTTP link to the head's join point, and the beat thread."""

    def __init__(self, head: str, rank: int) -> None:
        self.host, self.port = parse_head(head)
        self.rank = rank
        self.base = f"http://{self.host}:{self.port}"
        self.http = httpx.Client(timeout=httpx.Timeout(10.0))
        self.state: NodeState = "joining"
        self.error: str | None = None
        self.engines: list[str] = []
        self.reply: BeatReply | None = None
        self.last_answer = time.monotonic()
        self.joined = False
        """Only a joined node beats: a refused one's beat would fail the live node holding its rank."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hello(self, timeout_s: float) -> Hello:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return Hello.model_validate_json(self.http.get(f"{self.base}/hello").content)
            except (httpx.HTTPError, ValidationError):
                if time.monotonic() > deadline:
                    raise NodeError(
                        f"the head at {self.host}:{self.port} did not answer within {timeout_s:.0f} s "
                        "(engine.start_timeout_s): start `python -m backend serve` on the head first, and check "
                        "the address and that this node reaches it"
                    ) from None
                time.sleep(HELLO_POLL_S)

    def join(self, req: JoinRequest, say: Callable[[str], None]) -> JoinReply:
        """The head's plan for this node. A refusal that may lift (this rank's earlier node, restarted
        at once, not yet silent long enough) is tried again until it could have: an earlier node that
        is really gone then makes way, a live one with the same rank still beats and is named."""
        deadline: float | None = None
        while True:
            try:
                r = self.http.post(f"{self.base}/join", content=req.model_dump_json())
            except httpx.HTTPError as err:
                raise NodeError(
                    f"the head at {self.host}:{self.port} stopped answering while node {self.rank} was joining: {err}"
                ) from None
            if r.status_code == 200:
                self.joined = True
                return JoinReply.model_validate_json(r.content)
            refused = _refusal(r)
            wait = refused.retry_after_s if refused else None
            if wait is not None and deadline is None:
                deadline = time.monotonic() + wait + 2 * BEAT_S
                say(
                    f"node {self.rank}: the head still holds rank {self.rank} for an earlier node (restarted?); "
                    f"trying again for up to {deadline - time.monotonic():.0f} s"
                )
            if wait is None or deadline is None or time.monotonic() > deadline:
                raise NodeError(f"the head refused node {self.rank}: {refused.error if refused else r.text[:200]}")
            time.sleep(min(wait, BEAT_S))

    def beat_once(self) -> None:
        beat = Beat(rank=self.rank, state=self.state, error=self.error, engines=self.engines)
        try:
            r = self.http.post(f"{self.base}/beat", content=beat.model_dump_json())
            reply = BeatReply.model_validate_json(r.content)
        except (httpx.HTTPError, ValidationError):
            return
        self.reply = reply if r.status_code == 200 else BeatReply(head="failed", error=reply.error)
        self.last_answer = time.monotonic()

    def start_beating(self) -> None:
        def run() -> None:
            while not self._stop.wait(BEAT_S):
                self.beat_once()

        self._thread = threading.Thread(target=run, name="beat", daemon=True)
        self._thread.start()

    def head_says_stop(self) -> str | None:
        """Why this node must stop (the head stopped, failed or went silent); None to go on."""
        if time.monotonic() - self.last_answer > HEAD_LOST_S:
            return f"the head at {self.host}:{self.port} has not answered for {HEAD_LOST_S:.0f} s"
        if self.reply and self.reply.head in ("stopping", "failed"):
            return self.reply.error or f"the head is {self.reply.head}"
        return None

    def close(self, state: NodeState, error: str | None = None) -> None:
        """The last beat (this node stopped or failed), then no more."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=BEAT_S * 3)
        self.state, self.error = state, error
        if self.joined:
            self.beat_once()
        self.http.close()


def _refusal(r: httpx.Response) -> Refused | None:
    try:
        return Refused.model_validate_json(r.content)
    except ValidationError:
        return None


def run_node(
    settings: Settings, node_rank: int, head: str, *, model_given: bool, say: Callable[[str], None] = print
) -> int:
    """The worker node's whole life: 0 when the head stopped the plan, 1 on a failure (the head is told)."""
    link = HeadLink(head, node_rank)
    e = settings.engine
    try:
        for left in stop_leftovers():  # a killed node's vLLM worker would hold its GPU and ports
            say(f"node {node_rank}: {left.stopped()}")
        say(f"node {node_rank}: joining the head at {link.host}:{link.port}")
        hello = link.hello(e.start_timeout_s)
        if not 1 <= node_rank < hello.nnodes:
            raise NodeError(
                f"--node-rank {node_rank}: the head's plan spans {hello.nnodes} nodes; valid: 1..{hello.nnodes - 1}"
            )
        if not model_given:
            settings.model.id = hello.model_id
        resolved = resolve_model(settings)
        mine = JoinRequest(rank=node_rank, vllm=vllm_version(e.python), fingerprint=model_fingerprint(resolved.path))
        job = link.join(mine, say)
        link.start_beating()
        say(f"node {node_rank}: joined; plan: {job.plan.summary()}")
        run = _run_stage if job.plan.split_across_nodes else _run_replicas
        why = run(settings, job, link, resolved.path, say)
    except ErniechatError as err:
        say(f"error: node {node_rank}: {err}")
        link.close("failed", str(err))
        return 1
    except (KeyboardInterrupt, SystemExit):
        link.close("stopped", "stopped on that node (Ctrl-C or SIGTERM there)")
        raise
    say(f"node {node_rank}: {why}; stopping this node's part")
    failed = link.reply is not None and link.reply.head == "failed"
    link.close("stopped")
    return 1 if failed else 0


def _run_stage(settings: Settings, job: JoinReply, link: HeadLink, model_path: str, say: Callable[[str], None]) -> str:
    """This node's pipeline stage of a split engine, headless; returns why it stopped."""
    e, plan, rank = settings.engine, job.plan, link.rank
    argv = worker_argv(
        plan,
        python=e.python,
        model_path=model_path,
        node_rank=rank,
        master_addr=job.master_addr,
        master_port=job.master_port,
    )
    env = {**job.environment, "VLLM_HOST_IP": ip_towards(link.host)}
    if env.get("VLLM_CPU_OMP_THREADS_BIND") == "auto" and resolves_to_loopback(link.host):
        env["VLLM_CPU_OMP_THREADS_BIND"] = core_share(rank, plan.nodes) or "auto"
    refuse_eager_cpu_pipeline(plan, e.extra_args)
    full_argv = with_extra_args(argv, e.extra_args)
    run_dir = Path(e.run_dir)
    log_path = run_dir / f"engine-node{rank}.log"
    engine = Engine(f"node {rank}'s vLLM worker", full_argv, env, log_path, run_dir, link.host, 0)
    say(f"node {rank}: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())) + " " + " ".join(argv))
    say(f"node {rank}: vLLM worker log: {log_path}")
    engine.start()
    link.state = "starting"
    announced = False
    try:
        while True:
            why = link.head_says_stop()  # first: the head's stop may end this node's vLLM too
            if why:
                return why
            engine.read_log()
            fatal = engine.log.fatal
            if fatal is not None:  # a Fatal is always truthy: the same test as before
                raise NodeError(f"{fatal.what}: {fatal.fix}  [log: {engine.log.fatal_line[:200]}]")
            code = engine.exit_code()
            if code is not None:
                say(f"node {rank}: last lines of {log_path}:\n{engine.tail()}")
                raise NodeError(f"this node's vLLM worker exited (code {code}); its log: {log_path}")
            if link.reply and link.reply.head == "ready" and not announced:
                say(f"ready: node {rank} of {plan.nodes}; the head serves {link.reply.base_url}")
                announced = True
            time.sleep(BEAT_S)
    finally:
        engine.stop()


def replica_host(address: str, api_key: str | None, rank: int) -> str:
    """Where this node's engines listen: ``address``, where the head's router reaches them. Beyond
    loopback that is the network, so vLLM must ask for ``engine.api_key`` (the page's rule for an
    engine host beyond loopback)."""
    if not is_loopback(address) and not api_key:
        raise NodeError(
            f"node {rank}'s engines would listen on {address} for the head's router, beyond loopback, and "
            "engine.api_key is not set: anyone on that network could use them; set the same "
            "ERNIECHAT_ENGINE__API_KEY on every node"
        )
    return address


def _run_replicas(
    settings: Settings, job: JoinReply, link: HeadLink, model_path: str, say: Callable[[str], None]
) -> str:
    """This node's engines, started and warmed as on one machine; returns why it stopped."""
    from backend.runtime.serve import Server

    settings.engine.host = replica_host(ip_towards(link.host), settings.engine.api_key, link.rank)
    server = Server(settings, say=say, given=planned_as_given(settings, job.plan, model_path), node_rank=link.rank)
    link.state = "starting"
    try:
        if not server.start():
            raise NodeError(server.status.error or "this node's engines did not start")
        link.engines = [engine.root for engine in server.engines]
        link.state = "ready"
        say(f"ready: node {link.rank}: " + ", ".join(link.engines))
        while True:
            why = link.head_says_stop()
            if why:
                return why
            if not server.check():
                raise NodeError(server.status.error or "this node's engines stopped")
            server.keeper.wait(BEAT_S)  # an engine that exits wakes it at once
    finally:
        server.stop()
