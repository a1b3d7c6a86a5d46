"""Writes leave the reply's path: each write is queued and done by one task per page process, in
order. Most wait until the replies in flight end (each in flight from its message's arrival; at most
:data:`HOLD_S` later), so nothing on the way to a first token shares the event loop with them. A
person's words do not wait: a write asked for ``now`` (the user's message and its chat, a reply's text
so far, a reply's last version) is done at once, and with it every write queued before it, in order,
so that a page process that dies loses at most what was said in the last moment.

Chainlit's data layer swallows every database error; here a write that fails is said once in its
chat, and later writes go on being tried (the database may come back).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import chainlit as cl
from chainlit.context import context as chainlit_context
from chainlit.context import init_ws_context
from chainlit.session import WebsocketSession

from backend.page.chats.database import NotYours, first_line

log = logging.getLogger("erniechat.chats")

HOLD_S = 10.0
"""Longest a write waits for the replies in flight to end (a busy page still saves its chats)."""
MAX_QUEUED = 50_000
"""Writes kept while the database is slow or gone; the oldest are dropped beyond this."""
IN_WRITER: ContextVar[bool] = ContextVar("erniechat_in_writer", default=False)
"""Set in the writer's task: SQL there fails loudly (the failure is said), elsewhere it is forgiving."""


@dataclass
class Job:
    work: Callable[[], Awaitable[None]]
    what: str
    session: WebsocketSession | None
    number: int
    """Its place in the order the writes were asked for."""
    queued: float = field(default_factory=time.monotonic)


class Writer:
    """One task per page process does the database writes, in the order they were asked for: one asked
    for ``now`` (and every one before it) at once, the others once no reply is in flight (or
    :data:`HOLD_S` after they were asked for). A failed write is said once in the chat it belongs to;
    later ones go on being tried (the database may come back)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.queue: deque[Job] = deque()
        self.replies = 0
        self.told: set[str] = set()
        self.failures = 0
        self.last_error = ""
        self.asked = 0
        """Writes asked for so far; each job's ``number``."""
        self.due_upto = 0
        """Jobs up to this number are done without waiting for the replies in flight."""
        self.done_upto = 0
        """The number of the last job done (or failed)."""
        self.running = False
        """A job taken off the queue is being written (the queue alone would look empty meanwhile)."""
        self._wake: asyncio.Event | None = None
        self._quiet: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def _events(self) -> tuple[asyncio.Event, asyncio.Event, asyncio.Event]:
        if self._wake is None or self._quiet is None or self._idle is None:
            self._wake, self._quiet, self._idle = asyncio.Event(), asyncio.Event(), asyncio.Event()
            self._quiet.set()
            self._idle.set()
        return self._wake, self._quiet, self._idle

    def put(self, work: Callable[[], Awaitable[None]], what: str, now: bool = False) -> None:
        """Queue ``work``; with ``now``, it and every write queued before it are done at once, in order."""
        wake, _, idle = self._events()
        try:
            session = chainlit_context.session
        except Exception:  # an HTTP route's write (feedback): no chat to tell
            session = None
        if len(self.queue) >= MAX_QUEUED:
            dropped = self.queue.popleft()
            log.warning("chat store: %d writes waiting; dropped the oldest (%s)", MAX_QUEUED, dropped.what)
        self.asked += 1
        self.queue.append(Job(work, what, session if isinstance(session, WebsocketSession) else None, self.asked))
        if now:
            self.due_upto = self.asked
        idle.clear()
        wake.set()
        if self._task is None or self._task.done():
            # a context of its own: not the chat's that happened to ask first
            self._task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    @contextlib.contextmanager
    def reply(self) -> Iterator[None]:
        """Writes wait while this reply is in flight."""
        self._begin()
        try:
            yield
        finally:
            self._end()

    def hold(self, task: asyncio.Task[Any]) -> None:
        """Writes wait until ``task`` is done: a chat message's handler, from its arrival, so that the
        writes Chainlit asks for before ``on_message`` runs (the message, the chat's first name) do
        not start on the way to its first token."""
        self._begin()
        task.add_done_callback(lambda _: self._end())

    def _begin(self) -> None:
        _, quiet, _ = self._events()
        self.replies += 1
        quiet.clear()

    def _end(self) -> None:
        _, quiet, _ = self._events()
        self.replies -= 1
        if self.replies == 0:
            quiet.set()

    async def due_done(self, timeout: float = 10.0) -> bool:
        """Wait until the writes due now (asked for ``now``, and those before them) are done; False on timeout."""
        target, deadline = self.due_upto, time.monotonic() + timeout
        while self.done_upto < target and (self.queue or self.running) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return self.done_upto >= target or not (self.queue or self.running)

    async def flush(self, timeout: float = 60.0) -> bool:
        """Wait until every write asked for so far is done (or failed); False on timeout."""
        _, _, idle = self._events()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(idle.wait(), timeout)
        return idle.is_set()

    async def _run(self) -> None:
        wake, quiet, idle = self._events()
        IN_WRITER.set(True)
        while True:
            if not self.queue:
                idle.set()
                wake.clear()
                await wake.wait()
                continue
            job = self.queue[0]
            while job.number > self.due_upto and not quiet.is_set():
                left = HOLD_S - (time.monotonic() - job.queued)
                if left <= 0:
                    break
                wake.clear()  # set again by the next write asked for (it may be due now) or by quiet
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_first(quiet.wait(), wake.wait()), left)
            self.queue.popleft()
            self.running = True
            try:
                await job.work()
            except Exception as err:
                self._failed(job, err)
            finally:
                self.done_upto, self.running = job.number, False

    def _failed(self, job: Job, err: Exception) -> None:
        self.failures += 1
        self.last_error = first_line(err)
        log.warning("chat store: %s failed on %s (%s)", job.what, self.where, self.last_error)
        session = job.session
        if session is None or session.id in self.told:
            return
        self.told.add(session.id)
        why = (
            f"⚠️ This chat is no longer being saved: the chat database {self.where} failed ({self.last_error}). "
            "Replies go on; what is said from now on may be missing when the chat is reopened."
        )
        if isinstance(err, NotYours):
            why = f"⚠️ This chat is not being saved: {err}"
        asyncio.get_running_loop().create_task(_say(session, why))


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Until the first of ``waits`` is done (the others are cancelled)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def _say(session: WebsocketSession, words: str) -> None:
    """A notice in ``session``'s chat (its own task: the chat's context is set in it only)."""
    IN_WRITER.set(False)
    init_ws_context(session)
    with contextlib.suppress(Exception):  # the tab may be gone
        await cl.Message(content=words).send()
