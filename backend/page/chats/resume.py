"""A reopened chat's model history, rebuilt from its stored messages: each reply marks in its
metadata how much of its text went into the history, so the rebuilt turns are exactly the ones the
model saw (its own text, without the footer).
"""

from __future__ import annotations

import chainlit as cl
from chainlit.types import ThreadDict

from backend.page.chats.database import from_json

REPLY_CHARS = "reply_chars"
"""A reply's metadata key: the length of the model's own text in its content (after its heading, before
the footer); set on the replies that went into the model's history."""
REPLY_FROM = "reply_from"
"""Where the model's own text starts in a reply's content: after the heading that names its setup
(``backend.page.compare``); absent when the reply has none."""
COMPARED_KEY = "compared"
"""A reply's metadata key: true when the setup compared beside the plan wrote it (``up --compare``);
each setup's history holds its own replies only."""


def remember(history: list[dict[str, str]], reply: cl.Message, text: str, answer: str, start: int = 0) -> None:
    """A turn goes into the model's history, and the reply says so in its metadata, so that a reopened
    chat's history is rebuilt with exactly the same turns. ``start``: where ``answer`` begins in the
    reply's content (the length of its heading)."""
    history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
    reply.metadata = {**(reply.metadata or {}), REPLY_CHARS: len(answer), **({REPLY_FROM: start} if start else {})}


def history_of(thread: ThreadDict, compared: bool = False) -> list[dict[str, str]]:
    """The model's history of a stored chat: each reply that went into it (marked by :func:`remember`),
    after the message it answered, in the order the replies came; the plan's replies, or with
    ``compared`` those of the setup compared beside it."""
    steps = thread.get("steps") or []
    asked = {s["id"]: s.get("output") or "" for s in steps if s.get("type") == "user_message"}
    history: list[dict[str, str]] = []
    for step in steps:
        meta = from_json(step.get("metadata"), {})
        chars, question = meta.get(REPLY_CHARS), meta.get("in_reply_to")
        if step.get("type") != "assistant_message" or not isinstance(chars, int) or question not in asked:
            continue
        if bool(meta.get(COMPARED_KEY)) != compared:
            continue
        start = meta.get(REPLY_FROM) if isinstance(meta.get(REPLY_FROM), int) else 0
        answer = (step.get("output") or "")[start : start + chars]
        history += [{"role": "user", "content": asked[question]}, {"role": "assistant", "content": answer}]
    return history
