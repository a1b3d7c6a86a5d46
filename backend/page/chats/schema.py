"""The chat tables: created at the page's start and upgraded with the columns later Chainlit 2.x
releases write (:data:`TABLES`), idempotently, from any number of page processes at once.

An old database keeps its chats: a column Chainlit now reads is added to the table that lacks it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from backend.page.chats.database import make_engine, sqlite_file


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
