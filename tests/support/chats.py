"""Chats written straight into a page's database (Chainlit's data layer, this project's store) before
the page starts: tests that read or guard chats need no engine to make them."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from chainlit.context import init_http_context
from chainlit.user import User

from backend.page.chats.opening import run_now
from backend.page.chats.partial import INTERRUPTED, as_interrupted
from backend.page.chats.schema import ensure_schema
from backend.page.chats.store import ChatStore


@dataclass(frozen=True)
class Seeded:
    """One chat written for a user: its id, its question's and its answer's."""

    thread: str
    question: str
    answer: str


def seed_chats(url: str, user: str, chats: int, cut_off: bool = False) -> list[Seeded]:
    """``chats`` chats of ``user`` (made if new) in the database at ``url``, each a question and an answer;
    ``cut_off``: each answer as a page process that died mid-reply left it (``chats/partial``)."""
    run_now(ensure_schema(url))

    async def write() -> list[Seeded]:
        init_http_context()
        store = ChatStore(url)
        try:
            owner = await store.get_user(user) or await store.create_user(User(identifier=user))
            assert owner is not None
            made = []
            for n in range(chats):
                chat = Seeded(str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4()))
                await store.update_thread(chat.thread, name=f"{user}'s chat {n}", user_id=owner.id)
                for sid, kind, text in (
                    (chat.question, "user_message", "a question"),
                    (chat.answer, "assistant_message", "an answer"),
                ):
                    meta: dict[str, object] = {}
                    output = f"{text} {n}"
                    if kind == "assistant_message":
                        meta = {"in_reply_to": chat.question} | ({INTERRUPTED: True} if cut_off else {})
                        output = as_interrupted(output) if cut_off else output
                    step = {"id": sid, "threadId": chat.thread, "type": kind, "name": kind, "output": output}
                    await store.create_step({**step, "streaming": False, "metadata": meta})
                made.append(chat)
            assert await store.writer.flush()
            return made
        finally:
            await store.close()

    return asyncio.run(write())
