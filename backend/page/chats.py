"""Chats that last: Chainlit's SQLAlchemy data layer on SQLite (default) or Postgres.

Where: ``app.database_url`` when set (Postgres, or another SQLite file), else ``chats.db`` in the run
directory (``engine.run_dir``; the container's ``/data`` volume). The page creates its tables and adds
the columns later Chainlit 2.x releases write (:data:`TABLES`) at start, idempotently, from any number
of page processes at once.

Chainlit's ``SQLAlchemyDataLayer`` (checked against chainlit 2.12) is used with its known gaps closed:

- it binds thread and step tags as a Python list, which SQLite refuses: stored as JSON text there;
- JSON columns come back as strings (SQLite, and asyncpg's JSONB): read back as dicts and lists;
- it swallows every database error (a warning in the log, ``None`` returned): a write that fails is
  said once in its chat (:class:`Writer`), reads keep Chainlit's forgiving behaviour;
- elements (files) are not stored without a storage client: not attempted (an export is made anew);
- a missing thread's author raised ``ValueError`` (HTTP 500): now "Thread not found" (404);
- feedback and thread writes are checked against the chat's owner (Chainlit's ``/feedback`` route
  does not check who asks).

Writes leave the reply's path: each write is queued and done by one task per page process, in order,
after the replies in flight end (at most :data:`HOLD_S` later), so nothing on the way to a first token
waits for the database. On loopback without login the page has one local user (:func:`use_local_user`),
so the history sidebar shows with no password prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import re
import secrets
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import chainlit as cl
from chainlit.auth import create_jwt, decode_jwt
from chainlit.context import context as chainlit_context
from chainlit.context import init_ws_context
from chainlit.data.sql_alchemy import SQLAlchemyDataLayer
from chainlit.data.utils import queue_until_user_message
from chainlit.session import WebsocketSession
from chainlit.types import Feedback, ThreadDict
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import sessionmaker

from config.errors import ErniechatError
from config.settings import Settings, is_loopback

log = logging.getLogger("erniechat.chats")

DEFAULT_FILE = "chats.db"
HOLD_S = 10.0
"""Longest a write waits for the replies in flight to end (a busy page still saves its chats)."""
MAX_QUEUED = 50_000
"""Writes kept while the database is slow or gone; the oldest are dropped beyond this."""
LOCAL_USER = "local"
"""The one user of a page on loopback without login."""
SECRET_ENV = "CHAINLIT_AUTH_SECRET"
REPLY_CHARS = "reply_chars"
"""A reply's metadata key: the length of the model's own text at the start of its content (the rest
is the footer); set on the replies that went into the model's history."""


class StoreError(ErniechatError):
    """The chat database cannot be used; the message names it and says what to do."""


# -- the schema ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    name: str
    sqlite: str
    postgres: str


def _cols(spec: str) -> tuple[Column, ...]:
    """``name sqlite-type | postgres-type`` per line."""
    out = []
    for line in spec.strip().splitlines():
        name, types = line.split(None, 1)
        lite, pg = (t.strip() for t in types.split("|"))
        out.append(Column(name, lite, pg))
    return tuple(out)


TABLES: dict[str, tuple[Column, ...]] = {
    "users": _cols(
        """
        id TEXT PRIMARY KEY | UUID PRIMARY KEY
        identifier TEXT NOT NULL UNIQUE | TEXT NOT NULL UNIQUE
        metadata TEXT NOT NULL DEFAULT '{}' | JSONB NOT NULL DEFAULT '{}'
        createdAt TEXT | TEXT
        """
    ),
    "threads": _cols(
        """
        id TEXT PRIMARY KEY | UUID PRIMARY KEY
        createdAt TEXT | TEXT
        name TEXT | TEXT
        userId TEXT -> users | UUID -> users
        userIdentifier TEXT | TEXT
        tags TEXT | TEXT[]
        metadata TEXT | JSONB
        """
    ),
    "steps": _cols(
        """
        id TEXT PRIMARY KEY | UUID PRIMARY KEY
        name TEXT NOT NULL DEFAULT '' | TEXT NOT NULL DEFAULT ''
        type TEXT NOT NULL DEFAULT '' | TEXT NOT NULL DEFAULT ''
        threadId TEXT NOT NULL -> threads | UUID NOT NULL -> threads
        parentId TEXT | UUID
        streaming BOOLEAN NOT NULL DEFAULT 0 | BOOLEAN NOT NULL DEFAULT FALSE
        waitForAnswer BOOLEAN | BOOLEAN
        isError BOOLEAN | BOOLEAN
        metadata TEXT | JSONB
        tags TEXT | TEXT[]
        input TEXT | TEXT
        output TEXT | TEXT
        createdAt TEXT | TEXT
        command TEXT | TEXT
        modes TEXT | JSONB
        start TEXT | TEXT
        end TEXT | TEXT
        generation TEXT | JSONB
        showInput TEXT | TEXT
        language TEXT | TEXT
        indent INT | INT
        defaultOpen BOOLEAN | BOOLEAN
        autoCollapse BOOLEAN | BOOLEAN
        """
    ),
    "elements": _cols(
        """
        id TEXT PRIMARY KEY | UUID PRIMARY KEY
        threadId TEXT -> threads | UUID -> threads
        type TEXT | TEXT
        url TEXT | TEXT
        chainlitKey TEXT | TEXT
        name TEXT NOT NULL DEFAULT '' | TEXT NOT NULL DEFAULT ''
        display TEXT | TEXT
        objectKey TEXT | TEXT
        size TEXT | TEXT
        page INT | INT
        language TEXT | TEXT
        forId TEXT | UUID
        mime TEXT | TEXT
        props TEXT | JSONB
        autoPlay BOOLEAN | BOOLEAN
        playerConfig TEXT | JSONB
        """
    ),
    "feedbacks": _cols(
        """
        id TEXT PRIMARY KEY | UUID PRIMARY KEY
        forId TEXT NOT NULL | UUID NOT NULL
        threadId TEXT | UUID
        value INT NOT NULL | INT NOT NULL
        comment TEXT | TEXT
        """
    ),
}
"""Every column Chainlit 2.12's SQLAlchemy layer reads or writes (its docs' DDL, plus ``modes`` and
``autoCollapse``, which Step/Message write); a column added to a table that exists is added there."""
INDEXES = (
    'CREATE INDEX IF NOT EXISTS steps_thread ON steps ("threadId")',
    'CREATE INDEX IF NOT EXISTS threads_user ON threads ("userId")',
    'CREATE INDEX IF NOT EXISTS feedbacks_step ON feedbacks ("forId")',
)
PG_LOCK = 4_242_037
"""Postgres advisory lock that makes page processes set up the schema one at a time."""
JSON_STEP_KEYS = ("metadata", "generation", "modes")


def async_url(raw: str) -> str:
    """The SQLAlchemy URL with the async driver the page uses (asyncpg, aiosqlite)."""
    for plain, driver in (
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgres://", "postgresql+asyncpg://"),
        ("sqlite://", "sqlite+aiosqlite://"),
    ):
        if raw.startswith(plain):
            return driver + raw[len(plain) :]
    return raw


def database_url(settings: Settings) -> str:
    """``app.database_url``, else ``chats.db`` in the run directory."""
    if settings.app.database_url:
        return async_url(settings.app.database_url)
    return f"sqlite+aiosqlite:///{Path(settings.engine.run_dir).resolve() / DEFAULT_FILE}"


def sqlite_file(url: str) -> Path | None:
    parsed = make_url(url)
    return Path(parsed.database) if parsed.get_backend_name() == "sqlite" and parsed.database else None


def shown(url: str) -> str:
    """The database as a person names it: the file, or the URL without its password."""
    path = sqlite_file(url)
    if path is not None:
        return str(path)
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=True)


def make_engine(url: str) -> AsyncEngine:
    """Waits 30 s for a busy SQLite file (other page processes write it too); gives up on an
    unreachable Postgres after 5 s, and checks a pooled connection before use (a restarted server)."""
    if sqlite_file(url) is not None:
        return create_async_engine(url, connect_args={"timeout": 30})
    return create_async_engine(url, connect_args={"timeout": 5}, pool_pre_ping=True)


def _ddl(dialect: str) -> list[str]:
    out = []
    for table, columns in TABLES.items():
        body = ", ".join(f'"{c.name}" {_quoted(c.sqlite if dialect == "sqlite" else c.postgres)}' for c in columns)
        out.append(f"CREATE TABLE IF NOT EXISTS {table} ({body})")
    return out


def _quoted(sql_type: str) -> str:
    """``-> threads``: a reference to that table's ``"id"`` (Chainlit's names are case-sensitive, quoted)."""
    return re.sub(r"-> (\w+)", r'REFERENCES \1("id") ON DELETE CASCADE', sql_type)


def _added_type(sql_type: str) -> str:
    """A column added to an existing table: without the constraints SQLite cannot add that way (its
    rows have no value for it yet)."""
    plain = re.sub(r"\s+(PRIMARY KEY|UNIQUE|-> \w+)", "", sql_type)
    return plain.replace(" NOT NULL", "") if "DEFAULT" not in plain else plain


async def _columns(conn: Any, dialect: str, table: str) -> set[str]:
    if dialect == "sqlite":
        rows = await conn.exec_driver_sql(f"PRAGMA table_info({table})")
        return {r[1] for r in rows}
    query = (
        "SELECT column_name FROM information_schema.columns WHERE table_name = :t AND table_schema = current_schema()"
    )
    rows = await conn.execute(text(query), {"t": table})
    return {r[0] for r in rows}


async def ensure_schema(url: str) -> list[str]:
    """Create the tables, add missing columns; the columns added as ``table.column``. Idempotent;
    safe from several processes at once (SQLite: a refused duplicate is taken as done; Postgres:
    an advisory lock)."""
    engine = make_engine(url)
    dialect = "sqlite" if sqlite_file(url) is not None else "postgresql"
    added: list[str] = []
    try:
        async with engine.begin() as conn:
            if dialect == "sqlite":
                await conn.exec_driver_sql("PRAGMA journal_mode=WAL")  # readers never wait for a writer
            else:
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_LOCK})
            for statement in _ddl(dialect):
                await conn.exec_driver_sql(statement)
            for table, columns in TABLES.items():
                have = await _columns(conn, dialect, table)
                for c in columns:
                    if c.name in have:
                        continue
                    sql_type = _added_type(c.sqlite if dialect == "sqlite" else c.postgres)
                    try:
                        await conn.exec_driver_sql(f'ALTER TABLE {table} ADD COLUMN "{c.name}" {sql_type}')
                    except Exception as err:  # another page process added it just now
                        if "duplicate column" not in str(err):
                            raise
                    added.append(f"{table}.{c.name}")
            for statement in INDEXES:
                await conn.exec_driver_sql(statement)
    finally:
        await engine.dispose()
    return added


def _run_now(work: Coroutine[Any, Any, Any]) -> Any:
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
    why = f"{type(err).__name__}: {_first_line(err)}"
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


def _first_line(err: BaseException) -> str:
    inner = getattr(err, "orig", None) or err
    words = str(inner).strip().splitlines()
    return words[0] if words else type(inner).__name__


# -- writes off the reply's path ------------------------------------------------------------------
_IN_WRITER: ContextVar[bool] = ContextVar("erniechat_in_writer", default=False)
_REQUEST_USER: ContextVar[str | None] = ContextVar("erniechat_request_user", default=None)


@dataclass
class Job:
    work: Callable[[], Awaitable[None]]
    what: str
    session: WebsocketSession | None
    queued: float = field(default_factory=time.monotonic)


class Writer:
    """One task per page process does the database writes, in the order they were asked for, once no
    reply is in flight (or :data:`HOLD_S` after the write was asked for). A failed write is said once
    in the chat it belongs to; later ones go on being tried (the database may come back)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.queue: deque[Job] = deque()
        self.replies = 0
        self.told: set[str] = set()
        self.failures = 0
        self.last_error = ""
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

    def put(self, work: Callable[[], Awaitable[None]], what: str) -> None:
        wake, _, idle = self._events()
        try:
            session = chainlit_context.session
        except Exception:  # an HTTP route's write (feedback): no chat to tell
            session = None
        if len(self.queue) >= MAX_QUEUED:
            dropped = self.queue.popleft()
            log.warning("chat store: %d writes waiting; dropped the oldest (%s)", MAX_QUEUED, dropped.what)
        self.queue.append(Job(work, what, session if isinstance(session, WebsocketSession) else None))
        idle.clear()
        wake.set()
        if self._task is None or self._task.done():
            # a context of its own: not the chat's that happened to ask first
            self._task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    @contextlib.contextmanager
    def reply(self) -> Iterator[None]:
        """Writes wait while this reply is in flight."""
        _, quiet, _ = self._events()
        self.replies += 1
        quiet.clear()
        try:
            yield
        finally:
            self.replies -= 1
            if self.replies == 0:
                quiet.set()

    async def flush(self, timeout: float = 60.0) -> bool:
        """Wait until every write asked for so far is done (or failed); False on timeout."""
        _, _, idle = self._events()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(idle.wait(), timeout)
        return idle.is_set()

    async def _run(self) -> None:
        wake, quiet, idle = self._events()
        _IN_WRITER.set(True)
        while True:
            if not self.queue:
                idle.set()
                wake.clear()
                await wake.wait()
                continue
            job = self.queue[0]
            left = HOLD_S - (time.monotonic() - job.queued)
            if not quiet.is_set() and left > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(quiet.wait(), left)
            self.queue.popleft()
            try:
                await job.work()
            except Exception as err:
                self._failed(job, err)

    def _failed(self, job: Job, err: Exception) -> None:
        self.failures += 1
        self.last_error = f"{type(err).__name__}: {_first_line(err)}"
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


class NotYours(StoreError):
    """A write for a chat or message that belongs to another user."""


async def _say(session: WebsocketSession, words: str) -> None:
    """A notice in ``session``'s chat (its own task: the chat's context is set in it only)."""
    _IN_WRITER.set(False)
    init_ws_context(session)
    with contextlib.suppress(Exception):  # the tab may be gone
        await cl.Message(content=words).send()


# -- the data layer -------------------------------------------------------------------------------
def _json(value: Any, default: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return default
    return default if value is None else value


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
            if _IN_WRITER.get():
                raise
            log.warning("chat store: a read failed on %s (%s: %s)", self.writer.where, type(err).__name__, err)
            return None

    def _to_writer(self, work: Callable[[], Awaitable[None]], what: str) -> None:
        self.writer.put(work, what)

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
        if _IN_WRITER.get():
            await self._check_owner(thread_id, user_id)
            tags_value: Any = json.dumps(tags) if tags is not None and self.sqlite else tags
            await super().update_thread(thread_id, name, user_id, metadata, tags_value)
            return
        owner = user_id or _session_user_id()

        async def write() -> None:
            await self._check_owner(thread_id, owner)
            await self.update_thread(thread_id, name, user_id, metadata, tags)

        self._to_writer(write, "a chat's name or settings")

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
            thread["metadata"] = _json(thread.get("metadata"), {})
            thread["tags"] = _json(thread.get("tags"), None)
            for step in thread.get("steps", []):
                step["metadata"] = _json(step.get("metadata"), {})
                step["generation"] = _json(step.get("generation"), None)
                step["tags"] = _json(step.get("tags"), None)
        return threads

    # steps
    @queue_until_user_message()
    async def create_step(self, step_dict: Any) -> None:
        owner = _session_user_id()

        async def write() -> None:
            await self._check_owner(step_dict["threadId"], owner)
            await SQLAlchemyDataLayer.create_step.__wrapped__(self, self._storable(step_dict))

        self._to_writer(write, "a message")

    @queue_until_user_message()
    async def update_step(self, step_dict: Any) -> None:
        await ChatStore.create_step.__wrapped__(self, step_dict)

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
        asker = _REQUEST_USER.get()

        async def write() -> None:
            if await self._feedback_owner(feedback.forId, feedback.id) not in (asker, None) or asker is None:
                raise NotYours(f"feedback on message {feedback.forId} refused: not a message of {asker}'s chats")
            await SQLAlchemyDataLayer.upsert_feedback(self, feedback)

        self._to_writer(write, "a thumbs up or down")
        return feedback.id

    async def delete_feedback(self, feedback_id: str) -> bool:
        asker = _REQUEST_USER.get()

        async def write() -> None:
            rows = await self.execute_sql('SELECT "forId" FROM feedbacks WHERE "id" = :id', {"id": feedback_id})
            if isinstance(rows, list) and rows and await self._feedback_owner(rows[0]["forId"], None) == asker:
                await SQLAlchemyDataLayer.delete_feedback(self, feedback_id)

        self._to_writer(write, "a feedback's removal")
        return True

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


def _session_user_id() -> str | None:
    try:
        user = chainlit_context.session.user
    except Exception:
        return None
    return getattr(user, "id", None) if user is not None and hasattr(user, "createdAt") else None


# -- what the page uses ---------------------------------------------------------------------------
@dataclass
class Chats:
    """The page's chat store: ``layer`` when chats are saved, else ``problem`` says why not."""

    url: str
    layer: ChatStore | None = None
    problem: str | None = None
    local_user: bool = False

    @contextlib.contextmanager
    def reply(self) -> Iterator[None]:
        """Around a reply: the database writes wait until it is done."""
        if self.layer is None:
            yield
        else:
            with self.layer.writer.reply():
                yield

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
        added = _run_now(_settled(ensure_schema(url)))
    except Exception as err:
        chats.problem = problem_of(url, err)
        print(f"chat page: chats are not being saved: {chats.problem}", flush=True)
        return chats
    if added:
        print(f"chat page: the chat database {shown(url)} was upgraded (added {', '.join(added)})", flush=True)
    layer = chats.layer = ChatStore(url)
    cl.data_layer(lambda: layer)
    return chats


def not_saved_notice(chats: Chats) -> str | None:
    """The chat's one notice when chats are not being saved."""
    return f"⚠️ Chats are not being saved: {chats.problem}." if chats.problem else None


# -- one local user on loopback without login ------------------------------------------------------
def local_user_applies(settings: Settings, host: str, login_on: bool) -> bool:
    """One local user (no password prompt) only on loopback, without login and without configured
    users: an exposed page always has its password login, and a page with users is theirs."""
    return is_loopback(host) and not login_on and not settings.app.users


class _Identity:
    """ASGI middleware: notes who asks (for the feedback check) and, with the local user, gives each
    request and socket the local user's login cookie, so no login form is ever shown."""

    def __init__(self, app: Any, token: Callable[[], str] | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.token is not None:
            headers = [(k, v) for k, v in scope.get("headers", []) if k != b"cookie"]
            kept = [
                c
                for h in scope.get("headers", [])
                if h[0] == b"cookie"
                for c in h[1].decode("latin-1").split(";")
                if c.strip() and not c.strip().startswith("access_token")
            ]
            cookie = "; ".join([f"access_token={self.token()}", *(c.strip() for c in kept)])
            scope = {**scope, "headers": [*headers, (b"cookie", cookie.encode("latin-1"))]}
        marker = _REQUEST_USER.set(_asker(scope))
        try:
            await self.app(scope, receive, send)
        finally:
            _REQUEST_USER.reset(marker)


def _asker(scope: dict[str, Any]) -> str | None:
    """The logged-in user a request's cookie or bearer token names (None: nobody)."""
    token = None
    for key, value in scope.get("headers", []):
        if key == b"authorization" and value.lower().startswith(b"bearer "):
            token = value[7:].decode("latin-1")
        elif key == b"cookie" and token is None:
            for part in value.decode("latin-1").split(";"):
                name, _, val = part.strip().partition("=")
                if name == "access_token":
                    token = val
    if not token:
        return None
    try:
        return decode_jwt(token).identifier
    except Exception:
        return None


def use_identity(local_user: bool) -> None:
    """Install the middleware (before the server starts); with ``local_user``, the one local user."""
    from chainlit.server import app

    token: Callable[[], str] | None = None
    if local_user:
        os.environ.setdefault(SECRET_ENV, secrets.token_urlsafe(48))  # signs only this process's cookies
        user = cl.User(identifier=LOCAL_USER, metadata={"provider": "local"})
        made: list[tuple[float, str]] = []

        def fresh() -> str:
            if not made or time.monotonic() - made[0][0] > 3600:  # Chainlit's tokens expire (15 days by default)
                made[:] = [(time.monotonic(), create_jwt(user))]
            return made[0][1]

        token = fresh

        async def local(headers: Any) -> cl.User:
            return user

        cl.header_auth_callback(local)
    app.add_middleware(_Identity, token=token)


# -- resume and export ------------------------------------------------------------------------------
def remember(history: list[dict[str, str]], reply: cl.Message, text: str, answer: str) -> None:
    """A turn goes into the model's history, and the reply says so in its metadata, so that a reopened
    chat's history is rebuilt with exactly the same turns."""
    history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
    reply.metadata = {**(reply.metadata or {}), REPLY_CHARS: len(answer)}


def history_of(thread: ThreadDict) -> list[dict[str, str]]:
    """The model's history of a stored chat: each reply that went into it (marked by :func:`remember`),
    after the message it answered, in the order the replies came."""
    steps = thread.get("steps") or []
    asked = {s["id"]: s.get("output") or "" for s in steps if s.get("type") == "user_message"}
    history: list[dict[str, str]] = []
    for step in steps:
        meta = _json(step.get("metadata"), {})
        chars, question = meta.get(REPLY_CHARS), meta.get("in_reply_to")
        if step.get("type") != "assistant_message" or not isinstance(chars, int) or question not in asked:
            continue
        answer = (step.get("output") or "")[:chars]
        history += [{"role": "user", "content": asked[question]}, {"role": "assistant", "content": answer}]
    return history


EXPORT = "export"
EXPORT_COMMAND: dict[str, Any] = {
    "id": EXPORT,
    "icon": "download",
    "description": "Download this chat: Markdown and JSON",
    "button": False,
    "persistent": False,
    "selected": False,
}


def is_export(message: cl.Message) -> bool:
    """``/export``, chosen in the message box or typed."""
    return message.command == EXPORT or message.content.strip() == f"/{EXPORT}"


def _role(message: cl.Message) -> str:
    return "user" if message.type == "user_message" else "assistant"


def export_files(messages: list[cl.Message], title: str) -> tuple[str, str]:
    """(Markdown, JSON) of a chat's messages, as shown (replies with their footers)."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    shown_messages = [m for m in messages if m.type in ("user_message", "assistant_message") and not m.command]
    rows = [
        {
            "id": m.id,
            "role": _role(m),
            "created_at": m.created_at,
            "content": m.content,
            "metadata": m.metadata or {},
        }
        for m in shown_messages
    ]
    md = [f"# {title}", "", f"Exported {now}.", ""]
    for row in rows:
        who = "You" if row["role"] == "user" else "Assistant"
        md += [f"## {who} · {row['created_at']}", "", str(row["content"]), ""]
    doc = {"title": title, "exported_at": now, "messages": rows}
    return "\n".join(md), json.dumps(doc, ensure_ascii=False, indent=2, default=str)


async def send_export(messages: list[cl.Message], title: str) -> None:
    """The chat as two downloads, made in memory."""
    markdown, as_json = export_files(messages, title)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    files = [
        cl.File(name=f"chat-{stamp}.md", content=markdown.encode(), mime="text/markdown", display="inline"),
        cl.File(name=f"chat-{stamp}.json", content=as_json.encode(), mime="application/json", display="inline"),
    ]
    count = len([m for m in messages if m.type in ("user_message", "assistant_message") and not m.command])
    await cl.Message(content=f"This chat, {count} messages: Markdown and JSON.", elements=files).send()
