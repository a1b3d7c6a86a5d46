"""The chat page under test: ``chainlit run app.py`` against the session's engine.

Loaded by the app tests with ``pytest_plugins = ["conftest_app"]``; the engine itself comes
from ``conftest.py``. Replies are kept short (``app.max_tokens=32``): the demo model's text is
noise, so tests look at footers, metrics and message routing, not at words.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import ABANDONED_REPLY_S, ROOT, Engine, backend_env, free_port

from backend.engine import log_tail

PAGE_START_S = 90


@dataclass
class ChatPage:
    """One Chainlit server running app.py, in its own process group."""

    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(10)
                return
            except subprocess.TimeoutExpired:
                continue


def start_page(run_dir: Path, log_path: Path, **env: str) -> ChatPage:
    """Start app.py on a free port, reading the engine's status from ``run_dir``; wait for HTTP 200."""
    port = free_port()
    argv = [sys.executable, "-m", "chainlit", "run", "app.py", "--headless", "--host", "127.0.0.1", "--port", str(port)]
    page_env = backend_env(
        run_dir, ERNIECHAT_APP__MAX_TOKENS="32", ERNIECHAT_APP__ABANDONED_REPLY_S=str(ABANDONED_REPLY_S), **env
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=page_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    page = ChatPage(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + PAGE_START_S
    while time.monotonic() < deadline:
        if not page.alive():
            raise AssertionError(f"chainlit exited ({proc.returncode}):\n{page.log()}")
        try:
            if httpx.get(page.url + "/", timeout=2).status_code == 200:
                return page
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    page.stop()
    raise AssertionError(f"the chat page did not answer in {PAGE_START_S} s:\n{page.log()}")


@pytest.fixture(scope="session")
def chainlit_app(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatPage]:
    page = start_page(engine.run_dir, tmp_path_factory.mktemp("chat-page") / "chainlit.log")
    yield page
    page.stop()


SMALL_CONTEXT = 400


@pytest.fixture(scope="session")
def small_context_page(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatPage]:
    """A second page that keeps every request within a 400-token context (``workload.context``)."""
    log = tmp_path_factory.mktemp("small-context-page") / "chainlit.log"
    page = start_page(engine.run_dir, log, ERNIECHAT_WORKLOAD__CONTEXT=str(SMALL_CONTEXT))
    yield page
    page.stop()


@pytest.fixture
def page_without_engine(tmp_path: Path) -> Iterator[Callable[..., ChatPage]]:
    """Start pages on an empty run dir (no engine ever started), stopped after the test."""
    pages: list[ChatPage] = []

    def start(**env: str) -> ChatPage:
        pages.append(start_page(tmp_path / "run", tmp_path / f"chainlit-{len(pages)}.log", **env))
        return pages[-1]

    yield start
    for page in pages:
        page.stop()
