"""After ready: ``serve`` keeps what it started alive, restarts what dies and tells ``status``.

``serve`` waits on its processes' exits (pidfds), so it sees one die at once; a dead engine leaves the
router's rotation then, without waiting for the router's health checks. A dead engine, or the router,
is started again in a thread of its own, at most
``engine.restart_limit`` times within :data:`~backend.runtime.revive.RESTART_WINDOW_S`, each after a
longer pause (``revive``). Behind the router the other engines serve meanwhile and the run stays
ready; the plan's only engine, or the router, makes the run start again, so new messages wait for
it. ``status`` shows every engine as ``serve`` sees it (its process, its restarts) beside the
router's view, refreshed every :data:`ROUTER_CHECK_S`. :meth:`Keeper.halt` comes before the stop,
so no restart starts a process after it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from backend.runtime.components.engines import Engine
from backend.runtime.components.logwatch import Phase
from backend.runtime.components.router import Router, WorkerHealth
from backend.runtime.display import Display
from backend.runtime.processes.groups import wait_for_exit
from backend.runtime.revive import RestartBudget, Revival, bring_back
from backend.runtime.status import EngineReport, EngineState, EngineStatus, WarmupRecord
from config.pipeline import Planned
from config.plan import Plan
from config.settings import Settings

ROUTER = "router"
"""The router's key among the restarts under way (engines are keyed by their names)."""
ROUTER_START_S = 60.0
"""A relaunched router routes within seconds; this bound catches one that never does."""
ROUTER_CHECK_S = 1.0
"""How often the router and each engine's ``/health`` are asked (for ``status``) while serving."""


class Kept(Protocol):
    """What the keeper needs of ``serve``'s Server."""

    settings: Settings
    planned: Planned | None
    engines: list[Engine]
    router: Router | None
    status: EngineStatus
    node_rank: int
    display: Display
    say: Callable[[str], None]

    def update(self, state: str | None = None, detail: str | None = None, progress: float | None = None) -> None: ...
    def save(self) -> None: ...
    def fail(self, message: str) -> None: ...
    def node_problem(self) -> str | None: ...
    def stop_engines(self) -> None: ...
    def lower_engine_core(self, engine: Engine, plan: Plan) -> None: ...
    def warm(
        self, engine: Engine, plan: Plan, progress: Callable[[str, float], None] | None = None
    ) -> WarmupRecord: ...


class Keeper:
    """The restarts of one ``serve`` and its engines' records, from ready to stop."""

    def __init__(self, server: Kept) -> None:
        self.server = server
        self.lifecycle = threading.Lock()
        """Held while a process is started again, so that :meth:`halt` never misses one."""
        self.stopping = False
        self._budgets: dict[str, RestartBudget] = {}
        self._reviving: dict[str, threading.Thread] = {}
        self._gave_up: str | None = None
        """Why the run cannot go on (the only engine, or the router, is not coming back)."""
        self._checked_router = 0.0
        self._router_seen: list[WorkerHealth] = []

    def wait(self, timeout_s: float, also: Sequence[int] = ()) -> None:
        """Sleep up to ``timeout_s``, waking the moment an engine, the router or a process of ``also``
        exits (Linux pidfds), so that :meth:`check` sees it at once."""
        pids = [e.pid for e in self.server.engines] + [self.server.router.pid if self.server.router else None]
        wait_for_exit([p for p in [*pids, *also] if p], timeout_s)

    def halt(self) -> None:
        """No restart from now on (``serve`` is stopping); one under way starts no process."""
        with self.lifecycle:
            self.stopping = True

    def record_router(self) -> None:
        """Ask the router and each engine's ``/health`` (a few requests), then record every engine."""
        if self.server.router is not None:
            self.server.status.router = self.server.router.status_record()
            self._router_seen = self.server.router.health()
        self.record_engines()

    def record_engines(self) -> None:
        """``status.engines``: this node's engines as ``serve`` sees them (process, restarts) beside the
        router's last view of them; other nodes' engines, after these, as the router sees them."""
        if self.server.router is None:
            return
        seen = self._router_seen
        reports = []
        for i, engine in enumerate(self.server.engines):
            report = EngineReport(name=engine.name, url=engine.root, pid=engine.pid, state=engine.state)
            report.detail, report.restarts = engine.detail, engine.restarts
            if i < len(seen):
                report.in_rotation, report.load = seen[i].in_rotation, seen[i].load
                report.answers = seen[i].answers and engine.state == "serving"
            reports.append(report)
        for h in seen[len(self.server.engines) :]:
            reports.append(
                EngineReport(name=h.name, url=h.url, in_rotation=h.in_rotation, answers=h.answers, load=h.load)
            )
        self.server.status.engines = reports

    def check(self) -> bool:
        """False (and status failed) once serving has ended: a split engine lost a node, or the router or
        a plan's only engine died ``engine.restart_limit`` times within the window. What dies is restarted
        in the background (``_revive``, ``_revive_router``): behind the router the other engines serve
        meanwhile and the run stays ready; the router or a plan's only engine makes the run start again
        (new messages wait for it); the reply being streamed fails, nothing else."""
        if not self.server.engines:
            return False
        problem = self.server.node_problem()
        if problem:
            self.server.stop_engines()
            self.server.fail(problem)
            self.server.say(f"error: {problem}")
            return False
        router = self.server.router
        if router is not None and ROUTER not in self._reviving and (code := router.exit_code()) is not None:
            self._in_background(ROUTER, self._revive_router, router, code)
        if self._gave_up is not None:
            self.server.stop_engines()
            self.server.fail(self._gave_up)
            self.server.say(f"error: {self._gave_up}")
            return False
        for engine in self.server.engines:
            if engine.name not in self._reviving and (code := engine.exit_code()) is not None:
                self._in_background(engine.name, self._revive, engine, code)
        if self.server.router is not None and time.monotonic() - self._checked_router >= ROUTER_CHECK_S:
            self._checked_router = time.monotonic()
            self.record_router()
            self.server.save()
        return True

    def _in_background(self, key: str, revive: Callable[..., None], *args: Any) -> None:
        """Run one restart (``revive(*args)``) in a thread of its own, named ``key`` until it ends."""

        def run() -> None:
            try:
                revive(*args)
            finally:
                self._reviving.pop(key, None)

        self._reviving[key] = thread = threading.Thread(target=run, name=f"revive {key}", daemon=True)
        thread.start()

    def _bring_back(self, key: str, what: Revival) -> None:
        """Restart ``what`` (``revive.bring_back``) on the restart budget named ``key`` (an engine's
        name, or :data:`ROUTER`), said on the terminal and in ``status`` at each step."""
        budget = self._budgets.setdefault(key, RestartBudget(self.server.settings.engine.restart_limit))
        bring_back(what, budget, self.server.say, lambda: self.stopping, self.lifecycle)

    def _revive_router(self, router: Router, code: int) -> None:
        """The router again: meanwhile the run is starting (nobody can be served), then ready."""
        plan = self._plan()

        def give_up(why: str) -> None:
            self._gave_up = f"{why}; last log lines:\n{router.tail()}"

        def back(restarts: int) -> None:
            self.record_router()  # its new pid, and what it routes to, before the run says ready
            self.server.update("ready", plan.summary(), 1.0)
            self.server.display.done()
            self.server.say(f"the router is back (restart {restarts})")

        self._bring_back(
            ROUTER,
            Revival(
                label="the router",
                why=f"the router exited (code {code})",
                announce=lambda text: self.server.update("starting", text, 0.98),
                relaunch=router.relaunch,
                until_back=lambda: router.wait_routing(ROUTER_START_S),
                back=back,
                give_up=give_up,
            ),
        )

    def _revive(self, engine: Engine, code: int) -> None:
        """A dead engine again, healthy and warmed; behind the router the others serve meanwhile."""
        plan, e = self._plan(), self.server.settings.engine
        why = f"{engine.label} exited (code {code})"
        router = self.server.router
        if router is not None and not router.take_out(engine.root):  # at once, not after its health checks
            self.server.say(f"note: the router did not take {engine.label} out; its health checks will")
        if plan.split_across_nodes:  # its stages on the other nodes would have to start again with it
            self._give_up(engine, f"{why}; an engine split across nodes is not restarted alone")
            return

        def relaunch() -> None:
            engine.restart()
            if engine is self.server.engines[0]:
                self.server.status.engine_pid = engine.pid

        def until_back() -> None:
            engine.wait_healthy(plan.served_name, e.api_key, e.start_timeout_s, self._restart_phase(engine))
            self.server.lower_engine_core(engine, plan)
            if e.warmup:
                self.server.warm(engine, plan, self._restart_warming(engine))

        def back(restarts: int) -> None:
            if router is not None:
                router.take_in(engine.root)
            self._engine_state(engine, "serving", "")
            again = "" if self._alone else "; the router takes it in again"
            self.server.say(f"{engine.label} is back (restart {engine.restarts}){again}")

        self._bring_back(
            engine.name,
            Revival(
                label=engine.label,
                why=why,
                announce=lambda text: self._engine_state(engine, "restarting", text),
                relaunch=relaunch,
                until_back=until_back,
                back=back,
                give_up=lambda why: self._give_up(engine, f"{why}; last log lines:\n{engine.tail()}"),
            ),
        )

    def _plan(self) -> Plan:
        assert self.server.planned is not None  # restarts begin once the plan is up
        return self.server.planned.plan

    @property
    def _alone(self) -> bool:
        """Whether this node's engines have no router in front (one engine: the run waits for it)."""
        routed_worker = bool(self.server.node_rank and self.server.planned and self.server.planned.plan.routed)
        return self.server.router is None and not routed_worker

    def _engine_state(self, engine: Engine, state: EngineState, detail: str) -> None:
        """One engine's state in ``status``: the engine entry behind a router; the run's own state when
        it is the only one (restarting: starting, so that new messages wait; serving: ready)."""
        if self.stopping:
            return
        engine.state, engine.detail = state, detail
        if not self._alone:
            self.record_engines()
            self.server.save()
        elif state == "serving":
            assert self.server.planned is not None
            self.server.update("ready", self.server.planned.plan.summary(), 1.0)
            self.server.display.done()
        else:
            self.server.update("starting", detail, 0.02)

    def _restart_phase(self, engine: Engine) -> Callable[[Phase], None]:
        def on_phase(phase: Phase) -> None:
            text = f"restart {engine.restarts}: {phase.label}"
            if self._alone and not self.stopping:
                self.server.update(phase.state, text, phase.progress)
            else:
                self._engine_state(engine, "restarting", text)

        return on_phase

    def _restart_warming(self, engine: Engine) -> Callable[[str, float], None]:
        def progress(msg: str, frac: float) -> None:
            text = f"restart {engine.restarts}: warm-up: {msg}"
            if self._alone and not self.stopping:
                self.server.update("warming", text, 0.92 + 0.07 * frac)
            else:
                self._engine_state(engine, "restarting", text)

        return progress

    def _give_up(self, engine: Engine, message: str) -> None:
        """No more restarts: the run fails when this was its only engine; else the others serve."""
        if self._alone:
            self._gave_up = message  # check() fails the run, from the watching thread
            return
        engine.stop()
        self._engine_state(engine, "gave up", message.split("; last log lines")[0])
        self.server.say(f"note: {message}; the other engines serve")
