"""The page's chats at its start: the schema set up, the data layer registered with Chainlit, or,
when the database cannot be used, the page chats unsaved and says why (naming the database and what
to do) once at start and in each chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import chainlit as cl

from backend.page.chainlit_internals import own_feedback_routes
from backend.page.chats.database import database_url, first_line, shown, sqlite_file
from backend.page.chats.feedback import feedback_routes
from backend.page.chats.schema import ensure_schema
from backend.page.chats.store import ChatStore
from config.settings import Settings


@dataclass
class Chats:
    """The page's chat store: ``layer`` when chats are saved, else ``problem`` says why not."""

    url: str
    layer: ChatStore | None = None
    problem: str | None = None
    local_user: bool = False
    answering: set[str] = field(default_factory=set)
    """The user messages this page process is answering now (their ids): not cut off, whatever is stored."""

    @contextlib.contextmanager
    def reply(self, reply_to: str = "") -> Iterator[None]:
        """Around a reply to message ``reply_to``: the database writes that can wait, wait until it is done."""
        self.answering.add(reply_to)
        try:
            if self.layer is None:
                yield
            else:
                with self.layer.writer.reply():
                    yield
        finally:
            self.answering.discard(reply_to)

    def keep_saving(self, reply: cl.Message) -> None:
        """Save the reply's text as it streams (``partial``), until its next update."""
        if self.layer is not None:
            self.layer.keep_saving(reply)

    def hold(self, task: asyncio.Task[Any]) -> None:
        """The database writes wait until ``task`` (a chat message's handler) is done."""
        if self.layer is not None:
            self.layer.writer.hold(task)

    async def flush(self) -> None:
        if self.layer is not None:
            await self.layer.writer.flush()


def open_chats(settings: Settings) -> Chats:
    """Set up the schema and register the data layer; on failure the page chats unsaved and ``problem``
    says why (printed here once, said in each chat by the page)."""
    url = database_url(settings)
    chats = Chats(url)
    path = sqlite_file(url)
    try:
        if path is not None and settings.app.database_url is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        added = run_now(_settled(ensure_schema(url)))
    except Exception as err:
        chats.problem = problem_of(url, err)
        print(f"chat page: chats are not being saved: {chats.problem}", flush=True)
        return chats
    if added:
        print(f"chat page: the chat database {shown(url)} was upgraded (added {', '.join(added)})", flush=True)
    layer = chats.layer = ChatStore(url)
    cl.data_layer(lambda: layer)
    own_feedback_routes(feedback_routes(layer))  # another user's message or an unknown feedback: 403 / 404
    return chats


def not_saved_notice(chats: Chats) -> str | None:
    """The chat's one notice when chats are not being saved."""
    return f"⚠️ Chats are not being saved: {chats.problem}." if chats.problem else None


def run_now(work: Coroutine[Any, Any, Any]) -> Any:
    """Run ``work`` to its end on its own event loop, in a thread (at import, a loop may be running)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(work)
        except BaseException as err:  # handed to the caller
            box["error"] = err

    thread = threading.Thread(target=run, name="chat-schema")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


async def _settled(work: Awaitable[list[str]]) -> list[str]:
    """``work``, and on failure a moment for aiosqlite's thread to hand its error to the loop before
    it closes (else it fails in that thread, printed as an unhandled exception)."""
    try:
        return await work
    except Exception:
        await asyncio.sleep(0.1)
        raise


def problem_of(url: str, err: BaseException) -> str:
    """Why chats are not saved, naming the database and what to do."""
    where = shown(url)
    why = first_line(err)
    path = sqlite_file(url)
    if path is not None:
        if "not a database" in str(err) or "malformed" in str(err):
            return (
                f"the chat database {path} is not a SQLite database or is damaged ({why}). Move it away "
                f"(mv {path} {path}.bad) and restart the page to start a new one, or set app.database_url"
            )
        return (
            f"the chat database {path} cannot be opened or written ({why}). Check that its directory exists "
            "and is writable by the page, or set app.database_url"
        )
    return (
        f"the chat database {where} cannot be reached or written ({why}). Start it or fix app.database_url "
        "(ERNIECHAT_APP__DATABASE_URL), then restart the page"
    )
