"""The chat page under test: the product's ``ChatPage`` (``python -m backend.page.launch app.py``) against an engine.

Replies are kept short (``app.max_tokens=32``): the demo model's text is noise, so tests look
at footers, metrics and message routing, not at words.
"""

from __future__ import annotations

from pathlib import Path

from backend.runtime.processes.groups import group_processes
from backend.runtime.up import ChatPage
from support.ports import free_port
from support.services import ABANDONED_REPLY_S, backend_env

SMALL_CONTEXT = 400
"""The small-context page keeps every request within this many tokens (``workload.context``)."""


def start_page(run_dir: Path, log_path: Path, workers: int = 1, **env: str) -> ChatPage:
    """Start app.py on a free port, reading the engine's status from ``run_dir``; wait for HTTP 200.
    ``workers``: page processes behind the port (``backend/page/front.py``)."""
    page_env = backend_env(
        run_dir,
        **{"ERNIECHAT_APP__MAX_TOKENS": "32", "ERNIECHAT_APP__ABANDONED_REPLY_S": str(ABANDONED_REPLY_S), **env},
    )
    # base_env={}: backend_env is the whole environment (outer ERNIECHAT_* variables removed)
    page = ChatPage("127.0.0.1", free_port(), page_env, log_path, base_env={}, workers=workers)
    page.start()
    why = page.wait_serving()
    if why:
        page.stop()
        raise AssertionError(why)
    return page


def page_processes(page: ChatPage) -> list[int]:
    """The pids of a page's processes that serve chats (behind its front, when it has one)."""
    assert page.process.pid is not None
    pids = group_processes(page.process.pid)
    workers = [p for p in pids if "--channel-fd" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    return workers or [page.process.pid]
