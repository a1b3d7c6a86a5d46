"""Replies the page's death cut off, found when their chat is reopened, each offered again with Retry.

A reply that streams is stored with its text so far and a note that it was interrupted (``partial``);
its own last write replaces both. So a reply still marked :data:`~backend.page.chats.partial.INTERRUPTED`
when its chat is reopened, and not being written by this page process, was cut off by a page process
that died: it keeps its text and note, and gets a Retry button. A message whose reply had not begun (the
page died while it waited for the engine) gets a reply that says so, with Retry.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import chainlit as cl
from chainlit.types import ThreadDict

from backend.page.chats.database import from_json
from backend.page.chats.partial import AGAIN, INTERRUPTED

UNANSWERED = "This message was not answered: the page stopped before its reply began."


def retry_action(text: str, reply_to: str) -> cl.Action:
    """The Retry button under a reply: resends ``text`` as an answer to message ``reply_to``."""
    return cl.Action(name="retry", payload={"text": text, "reply_to": reply_to}, label="Retry", icon="rotate-ccw")


@dataclass(frozen=True)
class CutOff:
    """A message the page's death left without its whole reply."""

    question_id: str
    question: str
    reply_id: str | None
    """The cut-off reply (None: its reply had not begun)."""


def cut_off(thread: ThreadDict, answering: Collection[str]) -> list[CutOff]:
    """The chat's messages whose latest reply was cut off, and its last message if it was never answered;
    those this page process is answering now (``answering``: their ids) left out."""
    steps: list[dict[str, Any]] = [dict(s) for s in thread.get("steps") or []]
    asked = {s["id"]: s.get("output") or "" for s in steps if s.get("type") == "user_message" and not s.get("command")}
    latest: dict[str, dict[str, Any]] = {}
    for step in steps:
        question = from_json(step.get("metadata"), {}).get("in_reply_to")
        if step.get("type") == "assistant_message" and question in asked:
            latest[question] = step
    found = [
        CutOff(question, asked[question], reply["id"])
        for question, reply in latest.items()
        if from_json(reply.get("metadata"), {}).get(INTERRUPTED) and question not in answering
    ]
    last = next((s for s in reversed(steps) if s.get("type") == "user_message"), None)
    if last is not None and last["id"] in asked and last["id"] not in latest and last["id"] not in answering:
        found.append(CutOff(last["id"], asked[last["id"]], None))
    return found


async def offer_retries(thread: ThreadDict, answering: Collection[str]) -> None:
    """Retry under each cut-off reply of the reopened chat (sent once the tab shows the chat); a reply
    that says so, with Retry, for a message never answered."""
    for each in cut_off(thread, answering):
        again = retry_action(each.question, each.question_id)
        if each.reply_id is not None:
            await again.send(for_id=each.reply_id)
        else:
            meta = {"in_reply_to": each.question_id, INTERRUPTED: True}
            await cl.Message(content=f"⚠️ {UNANSWERED} {AGAIN}", metadata=meta, actions=[again]).send()
