"""Chainlit's ``SQLAlchemyDataLayer`` (checked against chainlit 2.12) with its known gaps closed:

- it binds thread and step tags as a Python list, which SQLite refuses: stored as JSON text there;
- JSON columns come back as strings (SQLite, and asyncpg's JSONB): read back as dicts and lists;
- it swallows every database error (a warning in the log, ``None`` returned): writes go through the
  :class:`~backend.page.chats.writer.Writer`, which says a failure once in its chat; reads keep
  Chainlit's forgiving behaviour;
- elements (files) are not stored without a storage client: not attempted (an export is made anew);
- a missing thread's author raised ``ValueError`` (HTTP 500): now "Thread not found" (404);
- feedback and thread writes are checked against the chat's owner (Chainlit's ``/feedback`` route
  does not check who asks; ``feedback`` answers it 403 / 404);
- a person's words are written at once (the user's message and its chat, a reply's last version, a
  thumbs up or down) and a streaming reply's text every second (``partial``); other writes wait for
  the replies in flight;
- a chat opened with :data:`~backend.page_client.UNSAVED_HEADER` (the page's own warm-up) is not written.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import chainlit as cl
from chainlit.context import context as chainlit_context
from chainlit.data.sql_alchemy import SQLAlchemyDataLayer
from chainlit.data.utils import queue_until_user_message
from chainlit.types import Feedback, ThreadDict
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import sessionmaker

from backend.page.chats.database import NotYours, from_json, make_engine, shown, sqlite_file
from backend.page.chats.identity import REQUEST_USER
from backend.page.chats.partial import PartialRow, PartialSaver
from backend.page.chats.writer import IN_WRITER, Writer
from backend.page_client import UNSAVED_HEADER

UNSAVED_ENVIRON = "HTTP_" + UNSAVED_HEADER.upper().replace("-", "_")

log = logging.getLogger("erniechat.chats")


class ChatStore(SQLAlchemyDataLayer):
    """Chainlit's SQLAlchemy data layer with queued writes, JSON read back, SQLite-safe tags and
    owner checks (the module docstring says why)."""

    def __init__(self, url: str) -> None:  # Chainlit's __init__ only builds an engine, and warns about files
        self._conninfo = url
        self.user_thread_limit = 1000
        self.show_logger = False
        self.storage_provider = None
        self.sqlite = sqlite_file(url) is not None
        self.engine = make_engine(url)
        self.async_session = sessionmaker(bind=self.engine, expire_on_commit=False, class_=AsyncSession)  # type: ignore[call-overload]
        self.writer = Writer(shown(url))
        self.partials = PartialSaver(lambda work, what: self.writer.put(work, what, now=True), self.save_partials)
        """Streaming replies' text so far, saved every second."""
        self.owners: dict[str, str | None] = {}
        """Thread id -> its owner's user id, as checked by the writer."""

    # SQL: strict in the writer (a failure is said), forgiving elsewhere as Chainlit is
    async def execute_sql(self, query: str, parameters: dict[str, Any]) -> list[dict[str, Any]] | int | None:
        try:
            async with self.async_session() as session, session.begin():
                result = await session.execute(text(query), parameters)
                if result.returns_rows:
                    rows: list[dict[str, Any]] = self.clean_result([dict(r._mapping) for r in result.fetchall()])
                    return rows
                return int(result.rowcount)
        except Exception as err:
            if IN_WRITER.get():
                raise
            log.warning("chat store: a read failed on %s (%s: %s)", self.writer.where, type(err).__name__, err)
            return None

    def _to_writer(self, work: Callable[[], Awaitable[None]], what: str, now: bool = False) -> None:
        if not _unsaved_session():
            self.writer.put(work, what, now)

    # threads
    async def update_thread(
        self,
        thread_id: str,
        name: str | None = None,
        user_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> None:
        if metadata is not None:
            metadata = {k: v for k, v in metadata.items() if k != "history"}  # rebuilt from the steps on resume
        if IN_WRITER.get():
            await self._check_owner(thread_id, user_id)
            tags_value: Any = json.dumps(tags) if tags is not None and self.sqlite else tags
            await super().update_thread(thread_id, name, user_id, metadata, tags_value)
            return
        owner = user_id or _session_user_id()

        async def write() -> None:
            await self._check_owner(thread_id, owner)
            await self.update_thread(thread_id, name, user_id, metadata, tags)

        self._to_writer(write, "a chat's name or settings", now=name is not None or user_id is not None)

    async def _check_owner(self, thread_id: str, user_id: str | None) -> None:
        """Refuse a write into another user's chat (a socket can ask for any thread id)."""
        if not user_id:
            return
        if thread_id not in self.owners:
            rows = await self.execute_sql('SELECT "userId" FROM threads WHERE "id" = :id', {"id": thread_id})
            self.owners[thread_id] = rows[0]["userId"] if isinstance(rows, list) and rows else None
            if len(self.owners) > 100_000:
                self.owners.clear()
        owner = self.owners[thread_id]
        if owner is not None and owner != user_id:
            raise NotYours("this chat id belongs to another user; start a new chat")
        self.owners[thread_id] = user_id

    async def get_thread_author(self, thread_id: str) -> str:
        """'' for a thread that does not exist: Chainlit's check then answers 404, not 500."""
        try:
            return await super().get_thread_author(thread_id)
        except ValueError:
            return ""

    async def get_all_user_threads(
        self, user_id: str | None = None, thread_id: str | None = None
    ) -> list[ThreadDict] | None:
        threads = await super().get_all_user_threads(user_id=user_id, thread_id=thread_id)
        for thread in threads or []:
            thread["metadata"] = from_json(thread.get("metadata"), {})
            thread["tags"] = from_json(thread.get("tags"), None)
            for step in thread.get("steps", []):
                step["metadata"] = from_json(step.get("metadata"), {})
                step["generation"] = from_json(step.get("generation"), None)
                step["tags"] = from_json(step.get("tags"), None)
        return threads

    # steps
    @queue_until_user_message()
    async def create_step(self, step_dict: Any) -> None:
        self._write_step(step_dict, now=step_dict.get("type") == "user_message")

    @queue_until_user_message()
    async def update_step(self, step_dict: Any) -> None:
        """A message's later version: a reply's last one (the partial saves of it end here)."""
        self.partials.untrack(step_dict["id"])
        self._write_step(step_dict, now=True)

    def _write_step(self, step_dict: Any, now: bool) -> None:
        owner = _session_user_id()

        async def write() -> None:
            await self._check_owner(step_dict["threadId"], owner)
            await SQLAlchemyDataLayer.create_step.__wrapped__(self, self._storable(step_dict))

        self._to_writer(write, "a message", now)

    def keep_saving(self, reply: cl.Message) -> None:
        """Save ``reply``'s text every second while it streams (``partial``), until its next update."""
        if not _unsaved_session():
            self.partials.track(reply)

    async def save_partials(self, rows: list[PartialRow]) -> set[str]:
        """Streaming replies' text so far, one transaction; the ids whose row was there to update."""
        done = set()
        query = text('UPDATE steps SET "output" = :output, "metadata" = :metadata WHERE "id" = :id')
        async with self.async_session() as session, session.begin():
            for row in rows:
                result = await session.execute(query, {"id": row.id, "output": row.output, "metadata": row.metadata})
                if getattr(result, "rowcount", 0):
                    done.add(row.id)
        return done

    @queue_until_user_message()
    async def delete_step(self, step_id: str) -> None:
        async def write() -> None:
            await SQLAlchemyDataLayer.delete_step.__wrapped__(self, step_id)

        self._to_writer(write, "a message's removal")

    def _storable(self, step_dict: Any) -> dict[str, Any]:
        """JSON text for dict columns Chainlit binds as they are (``modes``), and for tags on SQLite."""
        out = dict(step_dict)
        out.pop("feedback", None)
        if isinstance(out.get("modes"), (dict, list)):
            out["modes"] = json.dumps(out["modes"]) if out["modes"] else None
        if self.sqlite and isinstance(out.get("tags"), list):
            out["tags"] = json.dumps(out["tags"])
        return out

    # elements: not stored without a storage client (an export is made anew on request)
    async def create_element(self, element: Any) -> None:
        return None

    # feedback: the asker's own messages only
    async def upsert_feedback(self, feedback: Feedback) -> str:
        feedback.id = feedback.id or str(uuid.uuid4())
        asker = REQUEST_USER.get()

        async def write() -> None:
            if await self._feedback_owner(feedback.forId, feedback.id) not in (asker, None) or asker is None:
                raise NotYours(f"feedback on message {feedback.forId} refused: not a message of {asker}'s chats")
            await SQLAlchemyDataLayer.upsert_feedback(self, feedback)

        self._to_writer(write, "a thumbs up or down", now=True)
        return feedback.id

    async def delete_feedback(self, feedback_id: str) -> bool:
        asker = REQUEST_USER.get()

        async def write() -> None:
            rows = await self.execute_sql('SELECT "forId" FROM feedbacks WHERE "id" = :id', {"id": feedback_id})
            if isinstance(rows, list) and rows and await self._feedback_owner(rows[0]["forId"], None) == asker:
                await SQLAlchemyDataLayer.delete_feedback(self, feedback_id)

        self._to_writer(write, "a feedback's removal", now=True)
        return True

    async def message_owner(self, step_id: str) -> str | None:
        """Who owns the chat that message ``step_id`` is in (None: no such message)."""
        if not _uuid_or_none(step_id):
            return None
        query = 'SELECT t."userIdentifier" AS owner FROM steps s JOIN threads t ON s."threadId" = t."id" '
        rows = await self.execute_sql(query + 'WHERE s."id" = :id', {"id": step_id})
        return str(rows[0]["owner"] or "") if isinstance(rows, list) and rows else None

    async def feedback_message(self, feedback_id: str) -> str | None:
        """The message feedback ``feedback_id`` is on (None: no such feedback)."""
        if not _uuid_or_none(feedback_id):
            return None
        rows = await self.execute_sql('SELECT "forId" FROM feedbacks WHERE "id" = :id', {"id": feedback_id})
        return str(rows[0]["forId"]) if isinstance(rows, list) and rows else None

    async def _feedback_owner(self, step_id: str, feedback_id: str | None) -> str | None:
        """Who owns the chat of message ``step_id`` (and of feedback ``feedback_id`` if it exists)."""
        query = (
            'SELECT t."userIdentifier" AS owner FROM steps s JOIN threads t ON s."threadId" = t."id" '
            'WHERE s."id" = :step OR s."id" IN (SELECT "forId" FROM feedbacks WHERE "id" = :fid)'
        )
        rows = await self.execute_sql(query, {"step": step_id, "fid": feedback_id or step_id})
        owners = {r["owner"] for r in rows} if isinstance(rows, list) else set()
        if len(owners) > 1:
            return "\0"  # a feedback moved to another user's message: nobody's
        return next(iter(owners), None)

    async def close(self) -> None:
        """At the page's stop: the writes still waiting first."""
        await self.writer.flush(timeout=20)
        await self.engine.dispose()


def _uuid_or_none(text: str) -> str | None:
    """``text`` when it is a UUID (every id here is one; Postgres refuses to compare another)."""
    try:
        return str(uuid.UUID(text))
    except (ValueError, TypeError, AttributeError):
        return None


def _unsaved_session() -> bool:
    """Whether the chat being served asked not to be saved (the page's own warm-up)."""
    try:
        environ = chainlit_context.session.environ
    except Exception:
        return False
    return isinstance(environ, dict) and environ.get(UNSAVED_ENVIRON) == "1"


def _session_user_id() -> str | None:
    try:
        user = chainlit_context.session.user
    except Exception:
        return None
    return getattr(user, "id", None) if user is not None and hasattr(user, "createdAt") else None
