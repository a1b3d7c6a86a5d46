"""``/export``: a chat as Markdown and JSON downloads, made in memory from its messages as shown
(elements are not stored, so an export is made anew on each request)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import chainlit as cl

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
