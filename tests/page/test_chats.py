"""Chats that last (backend/page/chats/): Chainlit's data layer on a real SQLite file and a real
Postgres (Debian's ``postgresql``, a throwaway cluster run by a non-root user).

First the store itself on both databases (schema made and upgraded, JSON and tags read back, owner
checks, what a broken database says), then pages: on loopback without login (one local user, SQLite
in the run directory) and behind the login on Postgres, each restarted on its database and a chat
reopened and answered again; then the faults a person meets (a damaged SQLite file at start, the
database gone mid-chat).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from chainlit.context import init_http_context
from chainlit.types import Feedback
from chainlit.user import User
from support.app_client import ChatClient, footer_of
from support.chats import seed_chats
from support.held import LONG_STORY, long_reply_held
from support.page import SMALL_CONTEXT, page_processes, start_page
from support.ports import free_port
from support.postgres import Postgres
from support.services import Engine, status_of
from support.waiting import until_async

from backend.errors import PageError
from backend.page.chats.database import DEFAULT_FILE, async_url, sqlite_file
from backend.page.chats.identity import LOCAL_USER, REQUEST_USER, local_user_applies
from backend.page.chats.interrupted import UNANSWERED
from backend.page.chats.opening import open_chats, run_now
from backend.page.chats.partial import AGAIN, NOTE
from backend.page.chats.resume import COMPARED_KEY, REPLY_CHARS, REPLY_FROM, history_of
from backend.page.chats.schema import ensure_schema
from backend.page.chats.store import ChatStore
from backend.runtime.status import write_status
from backend.runtime.up import ChatPage
from config.settings import Settings

COMMON = ("the", "river", "light", "stone", "quiet", "morning", "small", "house", "green", "field")
SECRET = "s" * 48
USERS = {"ann": "tulip-orbit-canvas-41", "bob": "maple-quartz-harbor-77"}


def words(n: int) -> str:
    """About ``n`` tokens of plain text."""
    return " ".join(COMMON[i % len(COMMON)] for i in range(n))


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    pg = Postgres().start()
    yield pg
    pg.remove()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each kind (a fresh Postgres database per test)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'chats.db'}"
        return
    pg: Postgres = request.getfixturevalue("postgres")
    name = f"t{uuid.uuid4().hex[:12]}"
    _pg_admin(pg, f"CREATE DATABASE {name}")
    yield async_url(pg.url.rsplit("/", 1)[0] + f"/{name}")


def _pg_admin(pg: Postgres, sql: str) -> None:
    async def run() -> None:
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(pg.url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


# -- the store on both databases ----------------------------------------------------------------
OLD_SCHEMA = """
CREATE TABLE users ("id" {uuid} PRIMARY KEY, "identifier" TEXT NOT NULL UNIQUE, "metadata" {json} NOT NULL,
    "createdAt" TEXT);
CREATE TABLE threads ("id" {uuid} PRIMARY KEY, "createdAt" TEXT, "name" TEXT, "userId" {uuid},
    "userIdentifier" TEXT, "tags" {tags}, "metadata" {json});
CREATE TABLE steps ("id" {uuid} PRIMARY KEY, "name" TEXT NOT NULL, "type" TEXT NOT NULL, "threadId" {uuid} NOT NULL,
    "parentId" {uuid}, "streaming" BOOLEAN NOT NULL, "waitForAnswer" BOOLEAN, "isError" BOOLEAN, "metadata" {json},
    "tags" {tags}, "input" TEXT, "output" TEXT, "createdAt" TEXT, "start" TEXT, "end" TEXT, "generation" {json},
    "showInput" TEXT, "language" TEXT, "indent" INT);
INSERT INTO threads ("id", "name") VALUES ('{thread}', 'kept');
"""
"""Chainlit 2.0's schema (its docs then): no ``command``, ``modes``, ``defaultOpen``, ``autoCollapse``,
no elements or feedbacks tables; with a chat in it."""


def test_the_schema_is_made_once_and_an_old_one_is_upgraded_keeping_its_chats(db_url: str) -> None:
    thread = str(uuid.uuid4())
    sqlite = sqlite_file(db_url)
    types = (
        {"uuid": "TEXT", "json": "TEXT", "tags": "TEXT"}
        if sqlite
        else {"uuid": "UUID", "json": "JSONB", "tags": "TEXT[]"}
    )
    old = OLD_SCHEMA.format(thread=thread, **types)
    if sqlite:
        with sqlite3.connect(sqlite) as conn:
            conn.executescript(old)
    else:

        async def make_old() -> None:
            import asyncpg

            conn = await asyncpg.connect(db_url.replace("+asyncpg", ""))
            await conn.execute(old)
            await conn.close()

        asyncio.run(make_old())
    added = run_now(ensure_schema(db_url))
    assert {"steps.command", "steps.modes", "steps.defaultOpen", "steps.autoCollapse"} <= set(added), added
    assert run_now(ensure_schema(db_url)) == [], "a second start changes nothing"

    async def read() -> Any:
        store = ChatStore(db_url)
        try:
            return await store.get_thread(thread)
        finally:
            await store.close()

    assert asyncio.run(read())["name"] == "kept"


@asynccontextmanager
async def _store_of(db_url: str) -> AsyncIterator[ChatStore]:
    """A store on ``db_url`` in an HTTP request's context (Chainlit's data layer reads one), closed after."""
    init_http_context()
    store = ChatStore(db_url)
    try:
        yield store
    finally:
        await store.close()


def test_tags_and_json_come_back_as_written_and_writes_check_the_owner(db_url: str) -> None:
    """Chainlit's pitfalls: tags bound as a list (SQLite refused them), JSON read back as text; and
    a write into another user's chat, or feedback on another user's message, is refused."""
    run_now(ensure_schema(db_url))

    async def run() -> None:
        async with _store_of(db_url) as store:
            ann = await store.create_user(User(identifier="ann"))
            bob = await store.create_user(User(identifier="bob"))
            assert ann and bob
            tid, sid = str(uuid.uuid4()), str(uuid.uuid4())
            meta = {"in_reply_to": "q", REPLY_CHARS: 2, "timing": {"ttft_ms": 12.5, "parts": [1, 2]}}
            await store.update_thread(tid, name="first", user_id=ann.id, tags=["a", "b"], metadata={"k": [1]})
            step = {"id": sid, "threadId": tid, "name": "Assistant", "type": "assistant_message", "streaming": False}
            await store.create_step({**step, "output": "hi", "metadata": meta, "tags": ["t"], "modes": {"m": "v"}})
            await store.update_thread(tid, name="taken", user_id=bob.id)  # bob's socket naming ann's chat
            token = REQUEST_USER.set("bob")
            await store.upsert_feedback(Feedback(forId=sid, value=0, threadId=tid))
            REQUEST_USER.reset(token)
            token = REQUEST_USER.set("ann")
            await store.upsert_feedback(Feedback(forId=sid, value=1, threadId=tid))
            REQUEST_USER.reset(token)
            assert await store.writer.flush()
            thread = await store.get_thread(tid)
            assert thread is not None
            assert thread["name"] == "first" and thread["userIdentifier"] == "ann"
            assert thread["tags"] == ["a", "b"] and thread["metadata"] == {"k": [1]}
            (saved,) = thread["steps"]
            assert saved["metadata"] == meta and saved["tags"] == ["t"]
            assert saved["feedback"] is not None and saved["feedback"]["value"] == 1
            assert store.writer.failures == 2, store.writer.last_error
            assert await store.get_thread_author(str(uuid.uuid4())) == "", "a missing chat: 404, not 500"

    asyncio.run(run())


def test_a_users_message_and_its_chat_are_written_at_once_while_a_reply_is_in_flight(db_url: str) -> None:
    """Writes that can wait (a notice) wait while a reply is in flight; the user's message and the chat's
    name do not (they waited until the reply was done, and a page process that died mid-reply lost
    both), and the writes queued before them go first, in order."""
    run_now(ensure_schema(db_url))

    async def run() -> None:
        async with _store_of(db_url) as store:
            ann = await store.create_user(User(identifier="ann"))
            assert ann
            tid, notice, question = (str(uuid.uuid4()) for _ in range(3))
            step = {"threadId": tid, "name": "x", "streaming": False, "metadata": {}}
            with store.writer.reply():
                await store.create_step({**step, "id": notice, "type": "assistant_message", "output": "a notice"})
                await store.update_thread(tid, name="first words", user_id=ann.id)
                await store.create_step({**step, "id": question, "type": "user_message", "output": "first words"})
                assert await store.writer.due_done()
                thread = await store.get_thread(tid)
                assert thread is not None and thread["name"] == "first words" and thread["userIdentifier"] == "ann"
                assert [s["output"] for s in thread["steps"]] == ["a notice", "first words"]

    asyncio.run(run())


def test_a_database_that_cannot_be_used_is_named_with_what_to_do(tmp_path: Path) -> None:
    damaged = tmp_path / "chats.db"
    damaged.write_bytes(b"not a database " * 500)
    closed = f"postgresql://erniechat:pw@127.0.0.1:{free_port()}/chats"
    cases = {
        f"sqlite:///{damaged}": [
            f"{damaged} is not a SQLite database or is damaged",
            f"mv {damaged} {damaged}.bad",
        ],
        f"sqlite:///{tmp_path}/missing/chats.db": ["cannot be opened or written", "writable"],
        closed: ["cannot be reached", "app.database_url", "erniechat:***@127.0.0.1"],
    }
    for url, said in cases.items():
        opened = open_chats(Settings.model_validate({"app": {"database_url": url}}))
        assert opened.layer is None and opened.problem, url
        for part in said:
            assert part in opened.problem, opened.problem
        assert "pw@" not in opened.problem
    with pytest.raises(Exception, match=r"a Postgres \(postgresql://...\) or SQLite"):
        Settings.model_validate({"app": {"database_url": "mysql://u@h/db"}})


def test_the_local_user_is_for_a_page_on_loopback_without_login_or_users() -> None:
    plain, with_users = Settings(), Settings.model_validate({"app": {"users": USERS}})
    assert local_user_applies(plain, "127.0.0.1", login_on=False)
    assert not local_user_applies(plain, "0.0.0.0", login_on=False)
    assert not local_user_applies(with_users, "127.0.0.1", login_on=False), "users but no secret: no local user"
    assert not local_user_applies(with_users, "127.0.0.1", login_on=True)


def test_history_is_rebuilt_from_the_replies_that_went_into_it() -> None:
    q1, q2, q3 = (str(uuid.uuid4()) for _ in range(3))
    reply = "An answer."

    def chars(n: int) -> dict[str, int]:
        return {REPLY_CHARS: n}

    steps = [
        {"id": q1, "type": "user_message", "output": "first"},
        {"id": "n", "type": "assistant_message", "output": "⚠️ notice", "metadata": {}},
        {"id": "r1", "type": "assistant_message", "output": "⚠️ failed", "metadata": {"in_reply_to": q1}},
        {"id": q2, "type": "user_message", "output": "second"},
        {
            "type": "assistant_message",
            "output": f"{reply}\n\n---\n*TTFT 9 ms*",
            "metadata": {"in_reply_to": q2, "reply_chars": 10},
        },
        {"id": q3, "type": "user_message", "output": "third"},
        # Retry answered the first message after all: in the order the replies came
        {
            "type": "assistant_message",
            "output": "Late.\n\n---\n*TTFT*",
            "metadata": json.dumps({"in_reply_to": q1, "reply_chars": 5}),
        },
    ]
    assert history_of({"steps": steps}) == [  # type: ignore[typeddict-item]
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "Late."},
    ]


def test_each_compared_setups_history_holds_its_own_replies_without_their_headings() -> None:
    """Two setups answered each message (``up --compare``): the plan's history is its replies, the compared
    setup's its own, each reply's text read after the heading that names its setup."""
    q1, q2 = str(uuid.uuid4()), str(uuid.uuid4())

    def reply(question: str, setup: str, text: str, compared: bool) -> dict[str, Any]:
        head = f"**{setup}**\n\n"
        meta = {"in_reply_to": question, REPLY_CHARS: len(text), REPLY_FROM: len(head), "setup": setup}
        return {
            "type": "assistant_message",
            "output": f"{head}{text}\n\n---\n*TTFT 9 ms*",
            "metadata": meta | ({COMPARED_KEY: True} if compared else {}),
        }

    steps = [
        {"id": q1, "type": "user_message", "output": "first"},
        reply(q1, "plan", "Plan one.", False),
        reply(q1, "vllm serve defaults", "Defaults one.", True),
        {"id": q2, "type": "user_message", "output": "second"},
        reply(q2, "vllm serve defaults", "Defaults two.", True),  # the order alternates
        reply(q2, "plan", "Plan two.", False),
    ]
    thread: Any = {"steps": steps}
    assert [m["content"] for m in history_of(thread)] == ["first", "Plan one.", "second", "Plan two."]
    assert [m["content"] for m in history_of(thread, compared=True)] == [
        "first",
        "Defaults one.",
        "second",
        "Defaults two.",
    ]


# -- pages -------------------------------------------------------------------------------------------
async def _http(page: ChatPage, method: str, path: str, cookie: str | None = None, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60, headers={"Cookie": cookie} if cookie else {}) as http:
        return await http.request(method, f"{page.url}{path}", **kw)


async def _threads(page: ChatPage, cookie: str | None = None) -> list[dict[str, Any]]:
    r = await _http(page, "POST", "/project/threads", cookie, json={"pagination": {"first": 100}, "filter": {}})
    r.raise_for_status()
    data: list[dict[str, Any]] = r.json()["data"]
    return data


async def _saved(page: ChatPage, first: str, replies: int, cookie: str | None = None) -> dict[str, Any]:
    """The chat whose first message was ``first``, once ``replies`` replies of it are stored."""

    async def read() -> dict[str, Any] | None:
        for thread in await _threads(page, cookie):
            if thread["name"] == first:
                return thread
        return None

    def done(thread: dict[str, Any] | None) -> bool:
        return thread is not None and len(_replies(thread)) >= replies

    thread = await until_async(f"the chat {first[:30]!r} stored", read, done)
    assert thread is not None
    return thread


def _replies(thread: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in thread["steps"] if REPLY_CHARS in (s.get("metadata") or {})]


def _restart(page: ChatPage) -> ChatPage:
    """Stop the page's process and start it again, same settings, same database."""
    page.restart()
    why = page.wait_serving()
    assert why is None, why
    return page


def test_a_local_chat_is_kept_in_the_run_directory_reopened_after_a_restart_and_goes_on(
    engine: Engine, tmp_path: Path
) -> None:
    """On loopback without login: no password prompt (the local user), the chat is listed, its
    messages with footers and timings stored, thumbs up stored, exported; after a restart of the page it
    reopens and answers with its history rebuilt and fitted to the context window."""
    page = start_page(engine.run_dir, tmp_path / "page.log", ERNIECHAT_WORKLOAD__CONTEXT=str(SMALL_CONTEXT))
    first = f"Tell me about {words(60)}"
    try:

        async def before() -> tuple[str, str]:
            me = await _http(page, "GET", "/user")
            assert me.status_code == 200 and me.json()["identifier"] == LOCAL_USER, me.text
            config = (await _http(page, "GET", "/auth/config")).json()
            assert config["passwordAuth"] is False and config["headerAuth"] is True
            async with ChatClient(page.url) as tab:
                reply = await tab.ask(first)
                footer_of(reply)
                thread = await _saved(page, first, 1)
                r = await _http(
                    page,
                    "PUT",
                    "/feedback",
                    json={
                        "sessionId": tab.session_id,
                        "feedback": {"forId": reply["id"], "value": 1, "threadId": thread["id"]},
                    },
                )
                assert r.status_code == 200, r.text
                await tab.command("export")
                await tab.wait_for(lambda: len(tab.elements) >= 2, 60)
                by_name = {e["name"].rsplit(".", 1)[-1]: await tab.file(e) for e in tab.elements[-2:]}
                doc = json.loads(by_name["json"])
                assert [m["role"] for m in doc["messages"]][-2:] == ["user", "assistant"]
                assert doc["messages"][-1]["content"] == reply["output"]
                assert first in by_name["md"].decode() and "TTFT" in by_name["md"].decode()
            return thread["id"], reply["output"]

        thread_id, said = asyncio.run(before())
        assert (engine.run_dir / DEFAULT_FILE).is_file(), "kept in the run directory by default"

        async def stored() -> None:
            thread = await _saved(page, first, 1)
            (reply,) = _replies(thread)
            assert reply["output"] == said and reply["feedback"]["value"] == 1
            assert isinstance(reply["metadata"], dict) and reply["metadata"]["in_reply_to"]

        asyncio.run(until_async("the thumbs up stored", _feedback_of(page, first), bool, timeout=60))
        asyncio.run(stored())
        page = _restart(page)

        async def after() -> None:
            r = await _http(page, "GET", f"/project/thread/{thread_id}")
            assert r.status_code == 200 and r.json()["steps"], r.text
            async with ChatClient(page.url, thread_id=thread_id) as tab:
                resumed = tab.seen("resume_thread")[0]
                assert any(s.get("output") == said for s in resumed["steps"]), "the reply came back with its footer"
                reply = await tab.ask(f"And about {words(60)}")
                footer_of(reply)
                assert "1 earlier turn left out to fit the 400-token context" in reply["output"], reply["output"]
            await _saved(page, first, 2)

        asyncio.run(after())
    finally:
        page.stop()


def _feedback_of(page: ChatPage, first: str) -> Any:
    async def read() -> object:
        thread = await _saved(page, first, 1)
        return [r["feedback"] for r in _replies(thread) if r.get("feedback")]

    return read


async def _login(page: ChatPage, user: str) -> str:
    r = await _http(page, "POST", "/login", data={"username": user, "password": USERS[user]})
    assert r.status_code == 200, r.text
    return f"access_token={r.cookies['access_token']}"


def test_behind_the_login_each_user_sees_only_their_chats_on_postgres_also_after_a_restart_and_an_outage(
    engine: Engine, postgres: Postgres, tmp_path: Path
) -> None:
    """Ann's chat: not listed for Bob, not opened by Bob over HTTP nor over the socket; kept across a
    restart of the page; and when Postgres goes away mid-chat, replies go on and the chat says it once."""
    env = {
        "ERNIECHAT_APP__DATABASE_URL": postgres.url,
        "ERNIECHAT_APP__USERS": json.dumps(USERS),
        "ERNIECHAT_APP__AUTH_SECRET": SECRET,
    }
    page = start_page(engine.run_dir, tmp_path / "page.log", 1, **env)
    first = f"Ann asks {uuid.uuid4().hex[:8]}"
    try:

        async def isolated() -> str:
            assert (await _http(page, "GET", "/user")).status_code == 401, "no local user behind the login"
            ann, bob = await _login(page, "ann"), await _login(page, "bob")
            async with ChatClient(page.url, cookie=ann) as tab:
                footer_of(await tab.ask(first))
            thread = await _saved(page, first, 1, ann)
            tid = thread["id"]
            assert thread["userIdentifier"] == "ann"
            assert all(t["id"] != tid for t in await _threads(page, bob)), "listed for another user"
            for path in (f"/project/thread/{tid}", f"/project/thread/{tid}/element/{uuid.uuid4()}"):
                r = await _http(page, "GET", path, bob)
                assert r.status_code == 401 and first not in r.text, (path, r.status_code, r.text)
            r = await _http(page, "PUT", "/project/thread", bob, json={"threadId": tid, "name": "mine now"})
            assert r.status_code == 401
            with pytest.raises(PageError, match="cannot open the chat page's socket"):
                await ChatClient(page.url, thread_id=tid, cookie=bob).connect(timeout=60)
            return tid

        tid = asyncio.run(isolated())
        page = _restart(page)

        async def outage() -> None:
            ann = await _login(page, "ann")
            async with ChatClient(page.url, thread_id=tid, cookie=ann) as tab:
                assert any(first == s.get("output") for s in tab.seen("resume_thread")[0]["steps"])
                footer_of(await tab.ask("Still there?"))
                await _saved(page, first, 2, ann)
                postgres.stop()
                try:
                    for n in range(2):
                        footer_of(await tab.ask(f"Message {n} while the database is down."))
                        await tab.wait_for(lambda: _notices(tab), 120)
                    assert len(_notices(tab)) == 1, tab.texts()
                    assert "postgresql://erniechat@127.0.0.1" in _notices(tab)[0]
                finally:
                    postgres.start()

        asyncio.run(outage())
    finally:
        page.stop()


def _notices(tab: ChatClient) -> list[str]:
    return [t for t in tab.texts() if "no longer being saved" in t]


def test_feedback_is_refused_on_another_users_message_and_an_unknown_one_is_not_deleted(
    page_without_engine: Callable[..., ChatPage], tmp_path: Path
) -> None:
    """Chainlit's routes answered 200 "success" to feedback on another user's message (nothing was written)
    and to deleting a made-up feedback id: now 403 and 404, and the asker's own feedback comes and goes."""
    db = tmp_path / "chats.db"
    (ann_chat,) = seed_chats(async_url(f"sqlite:///{db}"), "ann", 1)
    env = {"ERNIECHAT_APP__USERS": json.dumps(USERS), "ERNIECHAT_APP__AUTH_SECRET": SECRET}
    page = page_without_engine(ERNIECHAT_APP__DATABASE_URL=f"sqlite:///{db}", **env)

    async def run() -> None:
        ann, bob = await _login(page, "ann"), await _login(page, "bob")

        async def put(cookie: str, for_id: str) -> httpx.Response:
            body = {"sessionId": "s", "feedback": {"forId": for_id, "value": 1, "threadId": ann_chat.thread}}
            return await _http(page, "PUT", "/feedback", cookie, json=body)

        async def delete(cookie: str, feedback_id: str) -> httpx.Response:
            return await _http(page, "DELETE", "/feedback", cookie, json={"feedbackId": feedback_id})

        for cookie, for_id, code in ((bob, ann_chat.answer, 403), (bob, str(uuid.uuid4()), 404), (ann, "x", 404)):
            r = await put(cookie, for_id)
            assert r.status_code == code and "success" not in r.text, (for_id, r.status_code, r.text)
        mine = await put(ann, ann_chat.answer)
        assert mine.status_code == 200, mine.text
        feedback = mine.json()["feedbackId"]
        for cookie, feedback_id, code in ((ann, str(uuid.uuid4()), 404), (bob, feedback, 403), (ann, "x", 404)):
            r = await delete(cookie, feedback_id)
            assert r.status_code == code and "success" not in r.text, (feedback_id, r.status_code, r.text)
        stored = await _http(page, "GET", f"/project/thread/{ann_chat.thread}", ann)
        (answer,) = [s for s in stored.json()["steps"] if s["id"] == ann_chat.answer]
        assert answer["feedback"]["value"] == 1, "bob's refused removal left ann's feedback"
        assert (await delete(ann, feedback)).status_code == 200
        assert (await delete(ann, feedback)).status_code == 404, "deleted twice"

    asyncio.run(run())


def test_a_damaged_sqlite_file_at_start_leaves_the_page_chatting_and_says_so_once_per_chat(
    engine: Engine, tmp_path: Path
) -> None:
    damaged = tmp_path / "chats.db"
    damaged.write_bytes(b"not a database " * 500)
    page = start_page(engine.run_dir, tmp_path / "page.log", ERNIECHAT_APP__DATABASE_URL=f"sqlite:///{damaged}")
    try:
        assert f"chats are not being saved: the chat database {damaged}" in page.log_path.read_text()

        async def run() -> None:
            async with ChatClient(page.url) as tab:
                footer_of(await tab.ask("Hello?"))
                footer_of(await tab.ask("Hello again?"))
                said = [t for t in tab.texts() if "Chats are not being saved" in t]
                assert len(said) == 1 and f"mv {damaged} {damaged}.bad" in said[0], tab.texts()
            r = await _http(page, "POST", "/project/threads", json={"pagination": {"first": 5}, "filter": {}})
            assert r.status_code in (400, 401), "no history without a database"

        asyncio.run(run())
    finally:
        page.stop()


# -- a page process that dies mid-reply ------------------------------------------------------------
async def _stored_reply(page: ChatPage, first: str, reply_id: str) -> dict[str, Any] | None:
    """The reply ``reply_id`` of the chat that began with ``first``, as the page reads it from its database."""
    for thread in await _threads(page):
        if thread["name"] == first:
            r = await _http(page, "GET", f"/project/thread/{thread['id']}")
            steps = r.json()["steps"] if r.status_code == 200 else []
            return next((s for s in steps if s["id"] == reply_id), None)
    return None


@pytest.mark.parametrize("chat", ["new", "existing"])
def test_a_page_killed_mid_reply_keeps_the_message_and_the_reply_so_far_and_offers_retry(
    engine: Engine, db_url: str, tmp_path: Path, chat: str
) -> None:
    """SIGKILL of the page process while a reply streams (the engine held, so the reply cannot end
    first): the chat is in the history, and reopens with the user's message and the reply as far as it
    had come, a note that it was interrupted and Retry, which answers it."""
    page = start_page(engine.run_dir, tmp_path / "page.log", ERNIECHAT_APP__DATABASE_URL=db_url)
    first = "Hello there." if chat == "existing" else LONG_STORY
    try:

        async def killed() -> tuple[str, str, str]:
            async with ChatClient(page.url) as tab:
                if chat == "existing":
                    footer_of(await tab.ask(first))
                async with long_reply_held(tab, engine) as (mid, _):
                    reply = tab.reply_to(mid)
                    assert reply is not None

                    def shown() -> str:  # the engine is held: the tab has or gets all text there is
                        return (tab.reply_to(mid) or {})["output"]

                    await until_async(
                        "the reply's text as the tab shows it saved",
                        lambda: _stored_reply(page, first, reply["id"]),
                        lambda step: step is not None and step["output"].startswith(f"{shown()}\n\n⚠️"),
                    )
                    text = shown()
                    for pid in page_processes(page):
                        os.kill(pid, signal.SIGKILL)
            return mid, reply["id"], text

        mid, reply_id, shown = asyncio.run(killed())
        page = _restart(page)

        async def reopened() -> None:
            (thread,) = [t for t in await _threads(page) if t["name"] == first]
            async with ChatClient(page.url, thread_id=thread["id"]) as tab:
                steps = {s["id"]: s for s in tab.seen("resume_thread")[0]["steps"]}
                assert steps[mid]["type"] == "user_message" and steps[mid]["output"] == LONG_STORY
                assert steps[reply_id]["output"] == f"{shown}\n\n⚠️ {NOTE} {AGAIN}", steps[reply_id]["output"]
                assert shown.strip(), "the reply had text when the page died"
                retry = await tab.wait_for(lambda: [a for a in tab.actions if a.get("forId") == reply_id], 60)
                assert retry[0]["name"] == "retry" and retry[0]["payload"]["reply_to"] == mid
                await tab.click(retry[0])
                again = tab.reply_to(mid)
                assert again is not None and again["id"] != reply_id
                footer_of(again)

        asyncio.run(reopened())
    finally:
        page.stop()


def test_a_page_killed_while_a_message_waits_for_the_engine_keeps_it_and_says_it_was_not_answered(
    engine: Engine, tmp_path: Path
) -> None:
    """The engine is starting (as its status says), so the message waits; the page process is killed
    meanwhile: the chat is in the history with the message, and once the engine is ready it reopens with a
    reply that says the message was not answered, with Retry, which answers it."""
    run = tmp_path / "run"
    ready = status_of(engine.run_dir)
    write_status(
        run, ready.model_copy(update={"state": "starting", "detail": "loading the weights", "pid": os.getpid()})
    )
    page = start_page(run, tmp_path / "page.log")
    text = f"Are you there? {uuid.uuid4().hex[:6]}"

    async def killed() -> str:
        tab = await ChatClient(page.url).connect(wait_start=False)  # the chat's start waits for the engine too
        try:
            mid = await tab.send(text)
            await tab.wait_for(lambda: any("waits until the engine is ready" in t for t in tab.texts()), 60)
            await until_async(
                "the message saved", lambda: _threads(page), lambda ts: any(t["name"] == text for t in ts)
            )
            for pid in page_processes(page):
                os.kill(pid, signal.SIGKILL)
        finally:
            await tab.close()
        return mid

    try:
        mid = asyncio.run(killed())
        write_status(run, ready)
        page = _restart(page)

        async def reopened() -> None:
            (thread,) = [t for t in await _threads(page) if t["name"] == text]
            async with ChatClient(page.url, thread_id=thread["id"]) as tab:
                steps = tab.seen("resume_thread")[0]["steps"]
                assert [s["output"] for s in steps if s["type"] == "user_message"] == [text]
                retry = await tab.wait_for(lambda: [a for a in tab.actions if a["name"] == "retry"], 60)
                assert retry[0]["payload"] == {"text": text, "reply_to": mid}
                said = tab.reply_to(mid)
                assert said is not None and said["output"] == f"⚠️ {UNANSWERED} {AGAIN}", said
                await tab.click(retry[0])
                footer_of(tab.reply_to(mid) or {"output": ""})

        asyncio.run(reopened())
    finally:
        page.stop()
