"""``serve``: plan, start vLLM (several engines and the router when the plan says so), follow
the logs, gate readiness on health + warm-up, then watch.

The engine is ready only after /health answers, /v1/models lists the model and the warm-up
has passed; a routed plan's engines start in waves (together unless they share a GPU whose free
memory each measures), each wave healthy and warmed before the next, then the router in front
of them takes the engine port. The status file tells every other process where things stand,
the router's engines included.

Several nodes: ``serve`` here is the head (node 0). It opens the join point
(``backend.runtime.multinode.cluster``) and prints each other node's line. With replicas it waits, after
its own engines, until every node's engines are up and puts them all behind its router; with
one engine split across nodes it starts its part of vLLM once every node has joined, and fails
when a node does. Worker nodes run ``backend.runtime.multinode.node``, which drives a ``Server`` too.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx

from backend.engine_api import engine_url
from backend.errors import EngineStartError, ErniechatError
from backend.runtime.components.engines import Engine, check_engine_build, start_waves, wait_all_healthy
from backend.runtime.components.logwatch import Phase
from backend.runtime.components.mps import MpsDaemon
from backend.runtime.components.placement import check_ports, plan_engines
from backend.runtime.components.router import Router, RouterConfig, RouterError, Worker
from backend.runtime.display import DEMO_BANNER, Display
from backend.runtime.expectation import expected_after_warmup
from backend.runtime.keeper import Keeper
from backend.runtime.multinode.cluster import Head, join_lines, open_join_point
from backend.runtime.multinode.node_identity import head_ip
from backend.runtime.processes.leftovers import find_leftovers, stop_leftovers
from backend.runtime.processes.process import IN_USE, ChildGroup, bind_problem
from backend.runtime.processes.runlock import RunLock, claims_for, port_claim
from backend.runtime.resolve import ResolvedModel, resolve_model
from backend.runtime.rundir import RunDir
from backend.runtime.status import EngineStatus, StartupRecord, WarmupRecord
from backend.runtime.supervisor import Supervisor
from backend.runtime.warmup import WarmupError, warm_up
from config.commands import HEAD_ADDRESS, MASTER_PORT, router_metrics_port
from config.performance.text import summary
from config.pipeline import Planned, plan_for
from config.plan import Plan
from config.settings import Settings


class Server:
    """The plan's engines (and the router in front of several) from start to stop; ``up`` drives
    it and the chat page together."""

    def __init__(
        self,
        settings: Settings,
        say: Callable[[str], None] = print,
        *,
        given: Planned | None = None,
        node_rank: int = 0,
        master_addr: str | None = None,
        master_port: int = MASTER_PORT,
        page_port: int | None = None,
    ) -> None:
        """``given``: the head's plan on a worker node (``node_rank`` > 0), which runs no router.
        ``master_addr``/``master_port``: on the head of a multi-node plan, where the nodes meet.
        ``page_port``: the chat page's port (``up``), which no engine of the plan may take."""
        self.settings = settings
        self.page_port = page_port
        self.say = say
        self.given = given
        self.node_rank = node_rank
        self.master_addr = master_addr
        self.master_port = master_port
        self.head: Head | None = None
        """The join point for the other nodes (multi-node plans, on the head)."""
        self.run_dir = RunDir(settings.engine.run_dir)
        self.status = EngineStatus(pid=os.getpid(), log_path=str(self.run_dir.log_path))
        self.engines: list[Engine] = []
        self.router: Router | None = None
        self.mps: MpsDaemon | None = None
        """The MPS daemon the engines share their GPU through (``gpu_sharing=mps``)."""
        self.planned: Planned | None = None
        self.resolved: ResolvedModel | None = None
        self.t0 = time.monotonic()
        self.display = Display(self.t0)
        self._updating = threading.Lock()
        self.lock = RunLock(claims_for(self.run_dir.path, [(settings.engine.port, "--engine-port")]))
        """One start per run directory and engine port (``runlock``); taken by :meth:`claim`."""
        self.supervisor = Supervisor()
        """What this start has started (``supervisor``), stopped in reverse by :meth:`stop`."""
        self.keeper = Keeper(self)
        """Once ready: restarts what dies, and the engines' records in ``status``."""

    # -- status --------------------------------------------------------------------------
    def update(self, state: str | None = None, detail: str | None = None, progress: float | None = None) -> None:
        with self._updating:  # warm-ups of several engines report from their own threads
            self._update(state, detail, progress)

    def _update(self, state: str | None, detail: str | None, progress: float | None) -> None:
        if state:
            self.status.state = state  # type: ignore[assignment]
        if detail is not None:
            self.status.detail = detail
        if progress is not None:
            self.status.progress = progress
        self.run_dir.write_status(self.status)
        self.display.show(self.status.state, self.status.detail, self.status.progress)

    def save(self) -> None:
        """The status file as it stands, without a line on the terminal (the watch loop's refreshes)."""
        with self._updating:
            self.run_dir.write_status(self.status)

    def fail(self, message: str) -> None:
        self.status.error = message
        self.update("failed", message)
        self.display.done()

    @property
    def base_url(self) -> str:
        """Where clients go: the router when there is one, else the one engine."""
        return engine_url(self.settings.engine.host, self.settings.engine.port)

    @property
    def engine(self) -> ChildGroup | None:
        """The first engine's process (the only one without a router)."""
        return self.engines[0].process if self.engines else None

    # -- start ---------------------------------------------------------------------------
    def claim(self, page_port: int | None = None) -> None:
        """Hold the run directory and the engine port (and ``page_port``) alone, before anything starts
        or is written; RunBusy names the start that holds one. A worker node shares its host's."""
        if self.lock.held or self.node_rank:
            return
        if page_port is not None and page_port != self.settings.engine.port:  # one the plan needs: refused later
            self.lock.claims.append(port_claim(page_port, "--port"))
        self.lock.acquire()

    def start(self) -> bool:
        """Resolve, plan, launch, wait for health, warm up. True when ready."""
        e = self.settings.engine
        self.claim()
        self.update("starting", "resolving the model", 0.01)
        if leftovers := find_leftovers():
            self.update(detail=f"stopping {len(leftovers)} process group(s) a killed start left running")
            for left in stop_leftovers(found=leftovers):
                self.say(left.stopped())
            self.update(detail="resolving the model")
        problem = bind_problem(e.host, e.port) if self.node_rank == 0 else None
        if problem == IN_USE:
            self.fail(
                f"port {e.port} on {e.host} is already in use (another engine?); stop it or choose "
                "another with --engine-port"
            )
            return False
        if problem:
            self.fail(f"port {e.port} on {e.host} {problem}; check engine.host (ERNIECHAT_ENGINE__HOST)")
            return False
        try:
            plan = self._plan()
        except ErniechatError as err:  # bad input: status says why too, and the caller reports it
            self.fail(str(err))
            raise
        to_health = warm_s = 0.0
        records: list[WarmupRecord] = []
        try:
            if plan.nodes > 1 and self.node_rank == 0:
                self._open_join_point(plan)
            if plan.split_across_nodes:
                assert self.head is not None
                self.head.wait_for(e.start_timeout_s, lambda msg: self.update(detail=msg))
                self.say(f"all {plan.nodes} nodes joined; starting the head's part of vLLM")
                self.head.set_state("starting")
            if self.mps:
                self.supervisor.start(self.mps)
                mps = f"the {plan.engine_count} engines' kernels run at once through an MPS daemon of your own"
                self.say(f"gpu sharing: {mps} (pipe {self.mps.pipe_dir})")
                self.status.notes.append("the engines share each GPU through MPS (gpu_sharing=mps)")
            # Engines together (CPU ones always, GPU ones when none measures its memory at start), else
            # one per GPU at a time; each wave healthy and warmed before the next (start_waves).
            kv_fixed = plan.kv_cache_memory_bytes is not None
            for wave in start_waves(plan.engine_count, plan.engines_per_gpu, plan.device, kv_fixed):
                launch = time.monotonic()
                started = [self.engines[i] for i in wave]
                for engine in started:
                    self.say(f"{engine.name}: " + " ".join(engine.argv))
                    self.supervisor.start(engine)
                if wave[0] == 0:
                    self.status.engine_pid = started[0].pid
                names = ", ".join(engine.name for engine in started)
                self.update("starting", f"launching vLLM ({names})" if plan.routed else "launching vLLM", 0.04)
                wait_all_healthy(
                    started,
                    plan.served_name,
                    e.api_key,
                    e.start_timeout_s,
                    self._on_phase,
                    self.start_problem,
                    on_healthy=lambda engine: self.lower_engine_core(engine, plan),
                )
                to_health += time.monotonic() - launch
                warm_t0 = time.monotonic()
                if e.warmup:
                    records += self._warm_together(started, plan)
                warm_s += time.monotonic() - warm_t0
        except EngineStartError as err:
            self.stop_engines()
            self.fail(str(err))
            return False
        except (WarmupError, httpx.HTTPError) as err:
            self.stop_engines()
            self.fail(f"warm-up failed: {err}")
            return False
        self._record_warmup(records[0] if records else WarmupRecord(disabled=True))
        if plan.routed and self.node_rank == 0 and not self._start_router(plan):
            return False
        log = self.engines[0].log
        self.status.startup = StartupRecord.measured(
            to_health, warm_s, time.monotonic() - self.t0, log.splits, log.kv_tokens, plan.memory.kv_tokens
        )
        if self.head:
            self.head.set_state("ready", self.base_url)
        self.update("ready", plan.summary(), 1.0)
        self.display.done()
        return True

    def _plan(self) -> Plan:
        """Resolve the model, plan, check the plan's ports and make its engines (nothing started yet)."""
        self.resolved = resolve_model(self.settings)
        if self.resolved.demo:
            self.status.demo = True
            why = self.resolved.note or "You asked for --model demo."
            self.display.done()
            self.say(DEMO_BANNER.format(why=why))
            if self.resolved.note:
                self.status.notes.append(self.resolved.note)
        self.update(detail="planning", progress=0.03)
        self.planned = self.given or plan_for(self.settings, model_path=self.resolved.path)
        plan = self.planned.plan
        self.status.model = self.settings.model.id if not self.resolved.demo else f"demo ({self.resolved.path})"
        self.status.served_name = plan.served_name
        self.status.plan_summary = plan.summary()
        self.status.plan_reasons = plan.reasons
        self.status.hardware = self.planned.hardware.name
        self.status.base_url = self.base_url
        self.status.notes.extend(self.planned.notes + plan.warnings)
        for note in self.planned.notes:
            self.say(f"note: {note}")
        for warning in plan.warnings:
            self.say(f"warning: {warning}")
        check_engine_build(plan, self.settings.engine.python, self.settings.engine.hardware)
        self.run_dir.write_plan(plan)
        if plan.gpu_sharing == "mps":
            self.mps = MpsDaemon(self.run_dir.path)
        e = self.settings.engine  # engine.port itself was checked before planning
        check_ports(plan, e.host, e.port, self.page_port, self.node_rank)
        if plan.split_across_nodes:  # node 0's part of vLLM: the API server and the first stage
            self.master_addr = self.master_addr or head_ip()
        self.engines = plan_engines(
            plan,
            e,
            self.planned.hardware,
            self.resolved.path,
            self.run_dir.path,
            self.run_dir.log_path,
            node_rank=self.node_rank,
            master_addr=self.master_addr or HEAD_ADDRESS,
            master_port=self.master_port,
            mps_env=self.mps.env if self.mps else None,
        )
        self.status.log_path = str(self.engines[0].log_path)
        self.display.done()
        self.say(f"plan: {plan.summary()}; engine log: {self.status.log_path}")
        return plan

    def node_problem(self) -> str | None:
        """A node's failure while a split engine serves (its stage is needed); None otherwise."""
        return self.head.problem() if self.head and self.head.split else None

    def start_problem(self) -> str | None:
        """A node's failure or refusal while this head's engines start: fatal to any plan's start, at once."""
        return self.head.problem() if self.head else None

    def _on_phase(self, phase: Phase) -> None:
        self.update(phase.state, phase.label, phase.progress)

    def lower_engine_core(self, engine: Engine, plan: Plan) -> None:
        """Apply the plan's engine_core_nice; once healthy, the worker exists and keeps its priority."""
        if plan.engine_core_nice and (note := engine.lower_core(plan.engine_core_nice, self.say)):
            self.status.notes.append(note)

    def _start_router(self, plan: Plan) -> bool:
        """The router on the engine port, in front of every (healthy, warmed) engine."""
        e = self.settings.engine
        workers = [Worker(url=g.root, name=g.name, log_path=g.log_path, process=g.process) for g in self.engines]
        if self.head:
            try:
                self.update("warming", f"waiting for the other {plan.nodes - 1} node(s)' engines", 0.98)
                self.head.wait_for(e.start_timeout_s, lambda msg: self.update(detail=msg), ready=True)
            except EngineStartError as err:
                self.stop_engines()
                self.fail(str(err))
                return False
            remote = self.head.remote_engines()
            workers += [
                Worker(url=url, name=f"node {rank} engine {i % plan.engine_count}")
                for i, (rank, url) in enumerate(remote)
            ]
            self.say(f"all {plan.nodes} nodes ready: {len(workers)} engines behind the router")
        config = RouterConfig(workers=workers, port=e.port, host=e.host, metrics_port=router_metrics_port(plan, e.port))
        self.router = Router(config, log_path=self.run_dir.path / "router.log", cwd=self.run_dir.path)
        self.supervisor.add(self.router)
        self.say("router: " + " ".join(self.router.argv))
        self.update("warming", "starting the router", 0.99)
        try:
            self.router.start(worker_timeout_s=e.start_timeout_s)
        except RouterError as err:
            self.stop_engines()
            self.fail(str(err))
            return False
        self.keeper.record_router()
        return True

    def _record_warmup(self, record: WarmupRecord) -> None:
        """Keep the first engine's warm-up record (status, the run dir, the terminal)."""
        assert self.planned is not None
        self.status.warmup = record
        self.run_dir.write_warmup(record)
        if not record.disabled:
            self.display.done()
            self.say(
                f"warm-up: first request TTFT {record.first_ttft_s * 1000:.0f} ms, steady "
                f"{record.steady_ttft_s * 1000:.0f} ms ({record.first_over_steady}x), "
                f"{record.requests} requests in {record.duration_s:.1f} s"
                + (f", on each of {len(self.engines)} engines" if self.planned.plan.routed else "")
            )
        self.status.expected, how = expected_after_warmup(self.settings, self.planned, record)
        self.say(f"expected: {summary(self.status.expected.at_load)}; {how}")

    def _warm_together(self, engines: list[Engine], plan: Plan) -> list[WarmupRecord]:
        """Warm a wave's engines at the same time (they share no GPU, or CPU engines on cores of their own;
        each warm-up its own thread and loop); one engine in this thread, so Ctrl-C stops it at once."""
        if len(engines) == 1:
            return [self.warm(engines[0], plan)]
        pool = ThreadPoolExecutor(max_workers=len(engines), thread_name_prefix="warm-up")
        try:
            return list(pool.map(lambda engine: self.warm(engine, plan), engines))
        finally:  # on a failure or Ctrl-C the engines are stopped next, which ends the other warm-ups
            pool.shutdown(wait=False, cancel_futures=True)

    def warm(self, engine: Engine, plan: Plan, progress: Callable[[str, float], None] | None = None) -> WarmupRecord:
        """Warm ``engine`` up; ``progress(message, fraction)`` (default: the run's own state, warming)."""
        if progress is None:
            self.update("warming", "warming up", 0.92)

            def progress(msg: str, frac: float) -> None:
                where = f"{engine.name}: " if plan.routed else ""
                self.update("warming", f"warm-up: {where}{msg}", 0.92 + 0.07 * frac)

        s = self.settings
        return asyncio.run(
            warm_up(
                engine.base_url,
                plan.served_name,
                plan,
                users=s.workload.users,
                prompt_tokens=s.workload.prompt_tokens,
                sampling=s.app.sampling(),
                api_key=s.engine.api_key,
                on_progress=progress,
                replicas=1 if plan.routed else None,
            )
        )

    # -- after ready ---------------------------------------------------------------------
    def check(self) -> bool:
        """False (and status failed) once serving has ended; restarts what died (``keeper``)."""
        return self.keeper.check()

    def stop_engines(self) -> None:
        """The engines, then the MPS daemon they share a GPU through."""
        self.supervisor.stop(only=(Engine, MpsDaemon))

    def _open_join_point(self, plan: Plan) -> None:
        """The head's join point, and the exact line for every other node."""
        assert self.resolved is not None and self.planned is not None
        e = self.settings.engine
        self.master_addr = self.master_addr or head_ip()
        model_id = "demo" if self.resolved.demo else self.settings.model.id
        gpus = self.planned.hardware.gpus_per_node
        self.head = open_join_point(
            plan, self.master_addr, self.master_port, e.python, self.resolved.path, model_id, gpus
        )
        self.supervisor.start(self.head)
        for line in join_lines(self.head):
            self.say(line)
        self.update("starting", f"waiting for {plan.nodes - 1} other node(s) at {self.head.address}", 0.04)

    def stop(self) -> None:
        """Stop everything this start runs, the last started first, and release its claim; a
        Server whose start was refused (another start holds the run directory) touches nothing."""
        if not self.lock.held and not self.node_rank:
            return
        self.keeper.halt()  # a restart under way starts no process after this
        if self.head:  # every other node hears it before this node's engines go
            self.head.tell_stop("failed" if self.status.state == "failed" else "stopping")
        self.supervisor.stop()  # the router, the engines, the MPS daemon, the join point
        if self.status.state != "failed":
            self.update("stopped", "stopped", self.status.progress)
            self.display.done()
        self.lock.release()


@contextmanager
def logged_server(settings: Settings, log_path: Path) -> Iterator[Server]:
    """A Server whose terminal output goes to a file (tune, benchmarks); stopped on exit."""
    with open(log_path, "w") as log:
        server = Server(settings, say=lambda msg: print(msg, file=log, flush=True))
        server.display = Display(server.t0, stream=log)
        try:
            yield server
        finally:
            server.stop()


def run_serve(settings: Settings, master_addr: str | None = None, master_port: int = MASTER_PORT) -> int:
    """The ``serve`` command: start, print ``ready: URL``, then watch until stopped."""
    server = Server(settings, master_addr=master_addr, master_port=master_port)
    try:
        if not server.start():
            print(f"error: {server.status.error}", file=sys.stderr)
            return 1
        print(f"ready: {server.base_url}", flush=True)
        while server.check():
            server.keeper.wait(1.0)  # an engine or the router that exits wakes it at once
        return 1
    finally:
        server.stop()
