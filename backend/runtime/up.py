"""``up``: the engine, then the chat page once the engine is ready; one Ctrl-C stops both.

Prints ``ready: <engine url>`` when the engine has passed warm-up and ``chat: <page url>``
when the page answers. The page runs ``app.py`` (``backend.page.launch``) in its own process group with
the same settings (passed as ``ERNIECHAT_*`` variables), so it reads the same status file.
Afterwards both are watched: if the engine dies the page stays up and tells its users; if the
page dies everything stops. SIGINT or SIGTERM stops both process groups, always.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx

from backend.engine_api import local_host
from backend.errors import ErniechatError, PageError
from backend.page.auth import exposed_without_login, login_note, login_on, weak_password_warning
from backend.runtime.compare import Beside
from backend.runtime.processes.child_tmp import OwnTmp
from backend.runtime.processes.groups import group_processes
from backend.runtime.processes.leftovers import stop_leftovers
from backend.runtime.processes.process import IN_USE, ChildGroup, bind_problem
from backend.runtime.revive import RestartBudget, Revival, bring_back
from backend.runtime.serve import Server
from backend.runtime.status import PageProcess, PageRecord, PageState
from config.compare import CompareSpec
from config.settings import ENV_DELIMITER, ENV_PREFIX, ROOT, Settings

PAGE_START_S = 120.0
"""Chainlit imports in a few seconds; this bound only catches a page that hangs."""
WATCH_S = 1.0
"""Longest ``up`` waits between two looks at what it runs; a process that exits wakes it at once."""


def settings_env(settings: Settings) -> dict[str, str]:
    """Every set value as an ``ERNIECHAT_SECTION__KEY`` variable (JSON for lists, dicts, numbers)."""
    env: dict[str, str] = {}
    for section, values in settings.model_dump(mode="json").items():
        for key, value in values.items():
            if value is None:
                continue
            text = value if isinstance(value, str) else json.dumps(value)
            env[f"{ENV_PREFIX}{section.upper()}{ENV_DELIMITER}{key.upper()}"] = text
    return env


class ChatPage:
    """The page (``python -m backend.page.launch app.py``: Chainlit without nest_asyncio) as a
    child in its own process group, logging to ``log_path``."""

    def __init__(
        self,
        host: str,
        port: int,
        env: dict[str, str],
        log_path: Path,
        base_env: dict[str, str] | None = None,
        app: str = "app.py",
        workers: int = 1,
    ) -> None:
        self.url = f"http://{local_host(host)}:{port}"
        self.log_path = log_path
        self.workers = workers
        argv = [sys.executable, "-m", "backend.page.launch", app, "--host", host, "--port", str(port)]
        argv += ["--workers", str(workers)] if workers > 1 else []
        self._child = (argv, env, base_env)
        self.process = self._process()

    def _process(self) -> ChildGroup:
        """The same own-process-group start and group stop as the engines'."""
        argv, env, base_env = self._child
        return ChildGroup(argv, env, self.log_path, cwd=ROOT, base_env=base_env, own_tmp=OwnTmp("the chat page"))

    @classmethod
    def for_settings(cls, settings: Settings, workers: int = 1) -> ChatPage:
        """Every value as resolved here (file, environment and flags together) goes in the
        environment, which outranks the file, so the page sees exactly what ``up`` saw.
        ``workers``: the plan's page processes."""
        a = settings.app
        log = Path(settings.engine.run_dir) / "chat-page.log"
        return cls(a.host, a.port, settings_env(settings), log, workers=workers)

    def start(self) -> None:
        self.process.start()

    def wait_serving(self) -> str | None:
        """None once ``/`` answers 200; else why not (the page exited, or took too long)."""
        deadline = time.monotonic() + PAGE_START_S
        with httpx.Client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                code = self.process.exit_code()
                if code is not None:
                    return f"the chat page exited during start-up (code {code}); last log lines:\n{self.tail()}"
                try:
                    if http.get(self.url + "/").status_code == 200:
                        return None
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
        return f"the chat page did not answer at {self.url} within {PAGE_START_S:.0f} s; see {self.log_path}"

    def pay_first_use(self) -> str | None:
        """One throwaway chat of one token through the page's socket, so that its imports, first
        socket, first render and first engine call are paid before anyone is let in: one from
        each of ``workers`` client addresses, which the front places on its processes in turn. The
        page keeps nothing of these chats (no "Hello." in anyone's history).
        None when done, else why not (the page still serves; the first user then pays)."""
        from backend.page_client import PageSession, loopback_sources

        async def chat_once(source: str | None) -> str | None:
            tab = await PageSession(self.url, source=source, unsaved=True).connect()
            try:
                await tab.set_settings(max_tokens=1)
                res = await tab.ask("Hello.", timeout=PAGE_START_S)
            finally:
                await tab.close()
            return res.error

        sources = loopback_sources(self.url, self.workers)
        try:
            for source in sources:
                if (why := asyncio.run(chat_once(source))) is not None:
                    return why
        except ErniechatError as err:
            return str(err)
        if len(sources) < self.workers:
            return f"only one of the page's {self.workers} processes was reached from this machine's address"
        return None

    def processes(self) -> list[PageProcess]:
        """Its processes: the one that serves chats, or the front and each process behind it."""
        pid = self.process.pid
        if pid is None:
            return []
        if self.workers == 1:
            return [PageProcess(pid=pid)]
        behind = [p for p in group_processes(pid) if p != pid and _serves_chats(p)]
        return [PageProcess(pid=pid, role="front"), *(PageProcess(pid=p) for p in behind)]

    def restart(self) -> None:
        """A fresh process group (after the page exited), on the same port."""
        self.stop()
        self.process = self._process()
        self.start()

    def tail(self, n: int = 12) -> str:
        return self.process.tail(n)

    def exit_code(self) -> int | None:
        return self.process.exit_code()

    def stop(self) -> None:
        self.process.stop(grace_s=5.0)


def _serves_chats(pid: int) -> bool:
    """Whether ``pid`` is a page process behind the front (it was handed its channel)."""
    try:
        return b"--channel-fd" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def record_page(server: Server, page: ChatPage, state: PageState, detail: str = "", restarts: int = 0) -> None:
    """The page and its processes in ``status`` (``up`` the moment they serve, restarting, down)."""
    server.status.page = PageRecord(
        url=page.url, state=state, detail=detail, restarts=restarts, processes=page.processes()
    )
    server.save()


def open_page(page: ChatPage, settings: Settings) -> None:
    """Once the page serves: say whether it has login, and pay its first use where no login is on."""
    print(login_note(settings), flush=True)
    if weak := weak_password_warning(settings):
        print(weak, flush=True)
    if login_on(settings):  # this client has no session cookie
        print("note: the page's first use is paid by the first user to log in", flush=True)
    elif (why := page.pay_first_use()) is not None:
        print(f"note: the page's first chat failed ({why}); the first user pays for its first use", flush=True)


def revive_page(
    page: ChatPage, code: int, budget: RestartBudget, settings: Settings, server: Server | None = None
) -> str | None:
    """Start the page again after it exited with ``code``, each time after a longer pause, until it
    serves (None) or its restarts are spent (why not, with its log's last lines); each step in
    ``server``'s status."""
    spent: list[str] = []
    done = [0]

    def tell(state: PageState, detail: str = "") -> None:
        if server is not None:
            record_page(server, page, state, detail, done[0])

    def until_back() -> None:
        if (problem := page.wait_serving()) is not None:
            raise PageError(problem)

    def back(restarts: int) -> None:
        done[0] += 1
        tell("up")
        open_page(page, settings)
        print(f"the chat page is back (restart {restarts}): {page.url}", flush=True)

    def give_up(why: str) -> None:
        spent.append(f"{why}; last log lines:\n{page.tail()}")
        tell("down", why)

    revival = Revival(
        label="the chat page",
        why=f"the chat page exited (code {code})",
        announce=lambda text: tell("restarting", text),
        relaunch=page.restart,
        until_back=until_back,
        back=back,
        give_up=give_up,
    )
    bring_back(revival, budget, lambda line: print(line, flush=True))
    return spent[0] if spent else None


def run_up(settings: Settings, compare: CompareSpec | None = None) -> int:
    """The ``up`` command. 0 after a clean stop; 1 when something failed. ``compare``: a second setup
    beside the plan (``--compare``), planned with it and started after it (``backend.runtime.compare``)."""
    a = settings.app
    why = exposed_without_login(settings)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    server = Server(settings, page_port=a.port)
    server.claim(page_port=a.port)  # another start on this run directory or these ports: refused here
    for left in stop_leftovers():  # a killed start's page would hold the page's port
        print(left.stopped(), flush=True)
    problem = bind_problem(a.host, a.port)
    if problem == IN_USE:
        print(
            f"error: port {a.port} on {a.host} is already in use, and the chat page needs it; "
            "stop what holds it or choose another with --port",
            file=sys.stderr,
        )
        return 1
    if problem:
        print(f"error: the chat page's port {a.port} on {a.host} {problem}; check app.host", file=sys.stderr)
        return 2
    # both setups planned, or refused here: nothing started and no file written yet
    beside = Beside.planned(server, compare) if compare is not None else None
    try:
        if not server.start():
            print(f"error: {server.status.error}", file=sys.stderr)
            return 1
        print(f"ready: {server.base_url}", flush=True)
        if beside is not None and not beside.start():
            print(f"error: the compared setup ({beside.label}): {beside.server.status.error}", file=sys.stderr)
            return 1
        assert server.planned is not None  # start() planned, or returned False above
        page = ChatPage.for_settings(settings, workers=server.planned.plan.page_processes)
        server.supervisor.start(page)  # stopped first by server.stop()
        why = page.wait_serving()
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 1
        record_page(server, page, "up")
        open_page(page, settings)
        print(f"chat: {page.url}", flush=True)
        engines = "both setups' engines" if beside is not None else "the engine"
        print(f"(page log: {page.log_path}; Ctrl-C stops the page and {engines})", flush=True)
        engine_up, budget = True, RestartBudget(settings.engine.restart_limit)
        while True:
            code = page.exit_code()
            if code is not None and (why := revive_page(page, code, budget, settings, server)) is not None:
                print(f"error: {why}; stopping", file=sys.stderr)
                return 1
            if engine_up and not server.check():
                engine_up = False  # check() has said why; the page stays and shows the error to its users
            if beside is not None:
                beside.check()
            watched = [p.pid for p in server.status.page.processes] if server.status.page else []
            server.keeper.wait(WATCH_S, also=watched)  # a process that exits wakes it at once
    finally:
        if beside is not None:
            beside.stop()
        server.stop()
