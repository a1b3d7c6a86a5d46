"""A reply's text so far, saved while it streams, so that a page process that dies (``kill -9``, out of
memory) leaves the reply as far as it had come, with a note that it was interrupted.

Chainlit writes a message when it is sent and when it is updated, not as it streams. Here one task per
page process wakes every :data:`SAVE_EVERY_S` and writes the text of every reply that grew since its
last save, all in one transaction (one ``UPDATE`` per reply): at most one transaction a second whatever
the number of chats, each row the reply's text so far. What is stored meanwhile is the text with
:data:`NOTE` after it and :data:`INTERRUPTED` in its metadata; the reply's own last write (its footer,
or why it stopped or failed) replaces both.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import chainlit as cl

SAVE_EVERY_S = 1.0
"""How often a streaming reply's text is saved: what a page process that dies loses at most."""
INTERRUPTED = "interrupted"
"""A reply's metadata key: True while it is being written (as stored meanwhile), so a reply that stays so
was cut off by the page's death."""
NOTE = "This reply was interrupted: the page stopped before it was finished."
AGAIN = "Press **Retry** to send your message again."
"""Said with a Retry button (offered when the chat is reopened: ``interrupted``)."""


def as_interrupted(text: str) -> str:
    """The reply as stored while it streams: its text so far and the note."""
    note = f"⚠️ {NOTE} {AGAIN}"
    return f"{text}\n\n{note}" if text else note


@dataclass(frozen=True)
class PartialRow:
    """One reply's text so far, as it goes into its ``steps`` row."""

    id: str
    text: str
    """The reply's text so far."""
    metadata: str
    """JSON text."""

    @property
    def output(self) -> str:
        return as_interrupted(self.text)


@dataclass
class _Live:
    message: cl.Message
    saved: str | None = None
    """The text last written (None: not yet; a reply whose row is not written yet stays so)."""


Save = Callable[[list[PartialRow]], Awaitable[set[str]]]
"""Writes rows (one transaction); the ids of those whose message was found."""
Queue = Callable[[Callable[[], Awaitable[None]], str], None]
"""Puts a write on the writer's queue, to be done at once (``Writer.put(..., now=True)``)."""


class PartialSaver:
    """The replies streaming in this page process, and the task that saves their text so far."""

    def __init__(self, queue: Queue, save: Save, every_s: float = SAVE_EVERY_S) -> None:
        self.queue = queue
        self.save = save
        self.every_s = every_s
        self.live: dict[str, _Live] = {}
        self.saves = 0
        """Transactions written so far (for the benchmark)."""
        self._task: asyncio.Task[None] | None = None

    def track(self, message: cl.Message) -> None:
        """Save ``message``'s text as it streams, until :meth:`untrack`."""
        self.live[message.id] = _Live(message)
        if self._task is None or self._task.done():
            # a context of its own: not the chat's that happened to start it
            self._task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    def untrack(self, message_id: str) -> None:
        """``message`` has its last version (written after any save already queued)."""
        self.live.pop(message_id, None)

    def rows(self) -> list[PartialRow]:
        """The replies whose text changed since their last save."""
        out = []
        for live in self.live.values():
            text = live.message.content if isinstance(live.message.content, str) else ""
            if text != live.saved:
                meta = {**(live.message.metadata or {}), INTERRUPTED: True}
                out.append(PartialRow(live.message.id, text, json.dumps(meta, default=str)))
        return out

    async def _run(self) -> None:
        while self.live:
            await asyncio.sleep(self.every_s)
            rows = self.rows()
            if rows:
                self.queue(self._writer(rows), "the replies' text so far")

    def _writer(self, rows: list[PartialRow]) -> Callable[[], Awaitable[None]]:
        async def write() -> None:
            still = [row for row in rows if row.id in self.live]  # a reply done meanwhile has its last version
            if not still:
                return
            written = await self.save(still)
            self.saves += 1
            for row in still:
                if row.id in written and (live := self.live.get(row.id)) is not None:
                    live.saved = row.text

        return write
