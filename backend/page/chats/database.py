"""Where the chat database is and how the page reaches it: the URL (``app.database_url``, else
``chats.db`` in the run directory), its async driver, its name as a person reads it, and the
errors of a database that cannot be used.

The schema, the writer, the data layer and the page's start all name and reach the database
through these, so each says it the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from config.errors import ErniechatError
from config.settings import Settings

DEFAULT_FILE = "chats.db"


class StoreError(ErniechatError):
    """The chat database cannot be used; the message names it and says what to do."""


class NotYours(StoreError):
    """A write for a chat or message that belongs to another user."""


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


def first_line(err: BaseException) -> str:
    """The driver's own first words of ``err`` (SQLAlchemy wraps them), for a one-line notice."""
    inner = getattr(err, "orig", None) or err
    words = str(inner).strip().splitlines()
    return words[0] if words else "it gave no reason"


def from_json(value: Any, default: Any) -> Any:
    """A JSON column's value: SQLite and asyncpg's JSONB hand it back as text; ``default`` when unreadable or null."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return default
    return default if value is None else value
