"""Several engines behind one endpoint: vllm-project's ``vllm-router`` as a child process.

The router is not written here (docs/router.md says which one, why, and what was measured):
this module starts it in its own process group (:class:`ChildGroup`), waits until it
routes to every engine, reports each engine's health as the router sees it (for ``status``)
and stops it with everything it spawned. Errors raise :class:`RouterError`, never exit.

Order: the engines first, each healthy; then the router. :meth:`Router.start` checks that
itself, so an engine that never becomes healthy is named with its log before the router
starts, and a port in use is refused before anything is launched.

Routing: ``sticky_least_loaded`` keys a conversation on the ``x-session-id`` header
(:data:`SESSION_HEADER`): its first request goes to the engine with the fewest sessions,
every later turn to the same engine, so its prefix stays in that engine's cache. A dead
engine leaves the rotation after ``health_failures`` failed checks (requests sent to it
meanwhile are retried on another engine; a reply streaming at the moment it died fails);
its sessions move to a live engine and stay there. It rejoins after ``health_successes``
good checks and takes new sessions. ``serve`` does not wait for those checks for an engine it started:
the moment its process exits it is taken out (:meth:`Router.take_out`), and put back once restarted.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from backend.engine_api import SESSION_HEADER, local_host
from backend.errors import EngineStartError
from backend.runtime.processes.child_tmp import OwnTmp
from backend.runtime.processes.process import ChildGroup, log_tail, port_in_use
from backend.runtime.status import RouterRecord

ROUTER_PACKAGE = "vllm-router"
ROUTER_VERSION = "0.1.17"
"""The pinned release (pip wheel, manylinux x86_64); its behaviour is what docs/router.md measured."""
ROUTER_MODULE = "vllm_router.launch_router"
DEFAULT_POLICY = "sticky_least_loaded"
POLICIES = ("sticky_least_loaded", "consistent_hash", "round_robin")
"""The ``vllm-router --policy`` values allowed here. Its default, ``cache_aware``, is left out: in
0.1.17 it wants token ids an HTTP router does not have, and sent every request to one engine."""
# The header the router keys a conversation on (first of its session headers): every request of a
# conversation sends it (page: the chat session; bench: one per simulated user). Without it a
# request is not sticky, and ``x-request-id`` would be taken as a session instead.


class RouterError(EngineStartError):
    """The router could not start or an engine behind it could not be reached; says which and why."""


@dataclass(frozen=True)
class Worker:
    """One engine behind the router."""

    url: str
    """The engine's root URL, ``http://host:port`` (no ``/v1``)."""
    name: str = ""
    """How messages call it (``engine 0``); the URL when empty."""
    log_path: Path | None = None
    """Its log, whose tail goes into errors."""
    process: ChildGroup | None = None
    """Its process when this process started it: an engine that exits is reported at once."""

    @property
    def label(self) -> str:
        return f"{self.name} ({self.url})" if self.name else self.url

    def tail(self, n: int = 12) -> str:
        return log_tail(self.log_path, n) if self.log_path else "(no log given)"


@dataclass
class WorkerHealth:
    """One engine as ``status`` shows it."""

    name: str
    url: str
    in_rotation: bool | None
    """The router's view: True while it sends requests there; None when the router cannot be asked."""
    answers: bool
    """The engine's own /health answered 200 just now."""
    load: int | None = None
    """Requests the router has in flight there (None when not reported)."""


@dataclass
class RouterConfig:
    """What the router is started with; :func:`router_argv` turns it into the command line."""

    workers: Sequence[Worker]
    port: int
    host: str = "127.0.0.1"
    metrics_port: int = 0
    """vllm-router always serves Prometheus metrics on its own port (default 29000, which two
    routers on one host would share and the second would die on): always give one."""
    policy: str = DEFAULT_POLICY
    health_interval_s: int = 2
    health_failures: int = 3
    health_successes: int = 2
    health_timeout_s: int = 5
    breaker_failures: int = 3
    """Failed requests in a row that take an engine out at once, before the health checks do
    (vllm-router's default, 10, let two requests of one user fail when an engine died)."""
    breaker_open_s: int = 10
    """How long such an engine is skipped before one request tries it again."""
    request_timeout_s: int = 1800
    log_level: str = "warning"
    """``info`` logs every new sticky session; warning keeps the log to what matters."""
    extra_args: list[str] = field(default_factory=list)


def router_argv(config: RouterConfig, python: str = sys.executable) -> list[str]:
    """The router's command line (``python -m vllm_router.launch_router``: no console script needed)."""
    if config.policy not in POLICIES:
        raise RouterError(f"router policy '{config.policy}' is not one of: {', '.join(POLICIES)}")
    if not config.metrics_port:
        raise RouterError("the router needs its own metrics port (vllm-router's default 29000 is shared)")
    return [
        python,
        "-m",
        ROUTER_MODULE,
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--worker-urls",
        *[w.url for w in config.workers],
        "--policy",
        config.policy,
        "--prometheus-host",
        config.host,
        "--prometheus-port",
        str(config.metrics_port),
        "--health-check-interval-secs",
        str(config.health_interval_s),
        "--health-failure-threshold",
        str(config.health_failures),
        "--health-success-threshold",
        str(config.health_successes),
        "--health-check-timeout-secs",
        str(config.health_timeout_s),
        "--cb-failure-threshold",
        str(config.breaker_failures),
        "--cb-timeout-duration-secs",
        str(config.breaker_open_s),
        # every engine is healthy before the router starts; check at once, not after 30 s
        "--worker-startup-check-interval",
        "1",
        "--request-timeout-secs",
        str(config.request_timeout_s),
        "--log-level",
        config.log_level,
        *config.extra_args,
    ]


def engine_answers(http: httpx.Client, url: str) -> bool:
    try:
        return http.get(f"{url.rstrip('/')}/health").status_code == 200
    except httpx.HTTPError:
        return False


class Router:
    """The router process: start after the engines are up, ask it about them, stop it."""

    def __init__(
        self, config: RouterConfig, *, log_path: Path, python: str = sys.executable, cwd: Path | None = None
    ) -> None:
        if not config.workers:
            raise RouterError("the router needs at least one engine")
        urls = [w.url for w in config.workers]
        if len(set(urls)) != len(urls):
            raise RouterError(f"the same engine URL is given twice: {', '.join(urls)}")
        self.config = config
        self.log_path = log_path
        self.argv = router_argv(config, python)
        self.cwd = cwd or log_path.parent
        self.process = self._process()
        self._checks: httpx.Client | None = None
        """:meth:`health`'s client, made at the first check and kept for this Router's life (``serve``
        checks every second; a new one costs about 50 ms of CPU, its TLS context: 5 % of a core). Not
        closed by :meth:`stop`: a restart's last check may still be using it from its own thread."""

    def _process(self) -> ChildGroup:
        return ChildGroup(self.argv, {}, self.log_path, cwd=self.cwd, own_tmp=OwnTmp("the router"))

    @property
    def url(self) -> str:
        return f"http://{local_host(self.config.host)}:{self.config.port}"

    @property
    def base_url(self) -> str:
        """What clients use, as for one engine: ``http://host:port/v1``."""
        return f"{self.url}/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://{local_host(self.config.host)}:{self.config.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.process.pid

    # -- start ---------------------------------------------------------------------------
    def check_ports(self) -> None:
        c = self.config
        for what, port in (("router port", c.port), ("router metrics port", c.metrics_port)):
            if port_in_use(c.host, port):
                raise RouterError(
                    f"{what} {port} on {c.host} is already in use (another router or engine?); "
                    "stop it or choose another port"
                )

    def wait_for_workers(self, timeout_s: float, poll_s: float = 0.5) -> None:
        """Until every engine's /health answers; else name the first one that does not, with its log."""
        deadline = time.monotonic() + timeout_s
        waiting = list(self.config.workers)
        with httpx.Client(timeout=httpx.Timeout(3.0)) as http:
            while True:
                for w in list(waiting):
                    code = w.process.exit_code() if w.process else None
                    if code is not None:
                        raise RouterError(
                            f"{w.label} exited (code {code}) before it was healthy; last log lines:\n{w.tail()}"
                        )
                    if engine_answers(http, w.url):
                        waiting.remove(w)
                if not waiting:
                    return
                if time.monotonic() >= deadline:
                    w = waiting[0]
                    others = f" (also not healthy: {', '.join(o.label for o in waiting[1:])})" if waiting[1:] else ""
                    log = f"; its log {w.log_path}" if w.log_path else ""
                    raise RouterError(
                        f"{w.label} was not healthy after {timeout_s:.0f} s{others}{log}; last log lines:\n{w.tail()}"
                    )
                time.sleep(poll_s)

    def start(self, timeout_s: float = 60.0, worker_timeout_s: float = 900.0) -> None:
        """Check ports, wait for every engine, launch the router, wait until all are in its rotation."""
        self.check_ports()
        self.wait_for_workers(worker_timeout_s)
        self.process.start()
        try:
            self._wait_routing(timeout_s)
        except BaseException:
            self.process.stop()
            raise

    def relaunch(self) -> None:
        """A fresh router process (after it died) on the same ports; :meth:`wait_routing` follows."""
        self.process.stop()
        self.process = self._process()
        self.process.start()

    def wait_routing(self, timeout_s: float) -> None:
        """Until the router routes to at least one engine (a relaunch, while others may be down)."""
        try:
            self._wait_routing(timeout_s, every=False)
        except BaseException:
            self.process.stop()
            raise

    def _wait_routing(self, timeout_s: float, every: bool = True) -> None:
        deadline = time.monotonic() + timeout_s
        want = {w.url for w in self.config.workers}
        with httpx.Client(timeout=httpx.Timeout(2.0)) as http:
            while time.monotonic() < deadline:
                code = self.process.exit_code()
                if code is not None:
                    raise RouterError(
                        f"the router exited during start-up (code {code}); last log lines:\n{self.tail()}"
                    )
                routing = self._in_rotation(http)
                if want <= routing or (routing and not every):
                    return
                time.sleep(0.2)
        which = "every" if every else "any"
        raise RouterError(
            f"the router did not route to {which} engine after {timeout_s:.0f} s; last log lines:\n{self.tail()}"
        )

    def _workers_reply(self, http: httpx.Client) -> list[dict[str, Any]] | None:
        try:
            r = http.get(f"{self.url}/workers")
            if r.status_code != 200:
                return None
            return list(r.json().get("workers", []))
        except (httpx.HTTPError, ValueError):
            return None

    def _in_rotation(self, http: httpx.Client) -> set[str]:
        return {w["url"] for w in self._workers_reply(http) or [] if w.get("is_healthy")}

    # -- while running -------------------------------------------------------------------
    def alive(self) -> bool:
        return self.process.proc is not None and self.process.exit_code() is None

    def exit_code(self) -> int | None:
        return self.process.exit_code()

    def _client(self) -> httpx.Client:
        if self._checks is None:
            self._checks = httpx.Client(timeout=httpx.Timeout(2.0))
        return self._checks

    def take_out(self, url: str) -> bool:
        """Take engine ``url`` out of the rotation now (its process exited: the router's own checks take
        seconds); True when the router did."""
        return self._change("remove_worker", url, 2.0)

    def take_in(self, url: str, timeout_s: float = 30.0) -> bool:
        """Put engine ``url`` back in the rotation (healthy again: the router adds it once its /health
        answers); True when the router did."""
        return self._change("add_worker", url, timeout_s)

    def _change(self, what: str, url: str, timeout_s: float) -> bool:
        if self.process.proc is not None and not self.alive():
            return False
        try:
            r = self._client().post(f"{self.url}/{what}", params={"url": url}, timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return r.status_code < 300

    def health(self) -> list[WorkerHealth]:
        """Every engine: in the router's rotation or not, its own /health, the router's load on it."""
        http = self._client()
        # one this process started and that died cannot answer; one started elsewhere is asked
        reply = self._workers_reply(http) if self.process.proc is None or self.alive() else None
        seen = {w.get("url"): w for w in reply or []}
        out = []
        for w in self.config.workers:
            entry = seen.get(w.url)
            in_rotation = None if reply is None else bool(entry and entry.get("is_healthy"))
            load = entry.get("load") if entry else None
            out.append(
                WorkerHealth(
                    name=w.name or w.url,
                    url=w.url,
                    in_rotation=in_rotation,
                    answers=engine_answers(http, w.url),
                    load=load if isinstance(load, int) and load >= 0 else None,
                )
            )
        return out

    def status_record(self) -> RouterRecord:
        """For ``status``: the router itself (its engines: :meth:`health`)."""
        return RouterRecord(
            url=self.url,
            pid=self.pid,
            alive=self.alive(),
            policy=self.config.policy,
            session_header=SESSION_HEADER,
            version=ROUTER_VERSION,
            log=str(self.log_path),
        )

    def tail(self, n: int = 12) -> str:
        return self.process.tail(n)

    # -- stop ----------------------------------------------------------------------------
    def stop(self, grace_s: float = 10.0) -> None:
        self.process.stop(grace_s)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
