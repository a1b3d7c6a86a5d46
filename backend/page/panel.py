"""The ``/latency`` command: this chat's replies as a table, a summary, a plot and CSV / JSON files.

Rows come from the chat's messages (each reply keeps its row in ``metadata["timing"]``), so a
chat reopened from the database has its panel too. ``/latency reset`` starts a new series in this
chat; ``/latency all`` shows every chat of this user since the page started.
"""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import chainlit as cl

from backend.engine_api import ChatResult
from backend.measure.plots import plot_latency
from backend.page.latency import (
    TIMING_KEY,
    AllChats,
    EngineStarts,
    expected_markdown,
    panel_markdown,
    rows_of,
    split_line,
    timing_row,
    to_csv,
    to_json,
)
from backend.page.link import Target
from backend.runtime.rundir import RunDir
from config.compare import PLAN_LABEL
from config.settings import load_settings

COMMAND = "latency"
OPTIONS = ("", "reset", "all")
PANEL_KEY = "panel"
"""Metadata of the panel's own messages (``{"panel": "latency"}``): not a reply of the model, so
not part of a conversation's history."""
SERIES_FROM = "latency_series_from"
"""The session key holding how many of this chat's replies came before ``/latency reset``."""
COMMANDS: list[Any] = [
    {
        "id": COMMAND,
        "icon": "gauge",
        "description": "This chat's latency: per reply, p50/p90/p99 (per setup when compared), plot, CSV and JSON "
        "(add: reset, all)",
        "button": False,
        "persistent": False,
        "selected": False,
    }
]


async def announce() -> None:
    """Offer ``/latency`` in the message box (on chat start and on resume)."""
    await cl.context.emitter.set_commands(COMMANDS)


def latency_args(message: cl.Message) -> str | None:
    """What follows ``/latency`` (chosen in the box, or typed by a script); None for other messages."""
    if message.command == COMMAND:
        return message.content.strip()
    text = message.content.strip()
    if text == f"/{COMMAND}" or text.startswith(f"/{COMMAND} "):
        return text[len(COMMAND) + 1 :].strip()
    return None


def user_key() -> str:
    """Who the chats belong to: the logged-in user, else the one local user."""
    user = cl.user_session.get("user")
    return str(getattr(user, "identifier", "") or "local")


def chat_rows() -> list[dict[str, Any]]:
    """This chat's rows, live or reopened: from its messages' metadata."""
    return rows_of(m.metadata for m in cl.chat_context.get() if m.type == "assistant_message")


async def show(args: str, all_chats: AllChats) -> None:
    """Answer ``/latency [reset|all]`` in the chat."""
    option = args.lower()
    if option not in OPTIONS:
        await say(f"⚠️ Unknown `/latency` option '{args[:40]}': use `/latency`, `/latency reset` or `/latency all`.")
        return
    rows = chat_rows()
    if option == "reset":
        cl.user_session.set(SERIES_FROM, len(rows))
        await say(f"A new latency series starts with the next reply ({len(rows)} earlier left out of `/latency`).")
        return
    if option == "all":
        rows, title = all_chats.of(user_key()), "Latency, all your chats since the page started"
    else:
        skip = cl.user_session.get(SERIES_FROM) or 0
        rows, title = rows[skip:], "Latency, this chat" + (" (since /latency reset)" if skip else "")
    elements: list[cl.Element] = []
    if rows:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        png = io.BytesIO()
        note = await asyncio.to_thread(plot_latency, rows, png)  # off the event loop: other chats stream on
        if note is None:
            elements.append(cl.Image(name="latency.png", content=png.getvalue(), display="inline", size="large"))
        elements += [
            cl.File(name=f"latency-{stamp}.csv", content=to_csv(rows), mime="text/csv", display="inline"),
            cl.File(name=f"latency-{stamp}.json", content=to_json(rows), mime="application/json", display="inline"),
        ]
    expected = await asyncio.to_thread(beside_expected, rows)  # a prediction takes a moment: off the event loop
    await say(panel_markdown(rows, title) + (f"\n\n{expected}" if expected else ""), elements)


def beside_expected(rows: list[dict[str, Any]]) -> str:
    """The series beside the running plan's prediction for one user (``latency.expected_markdown``)."""
    run_dir = RunDir(load_settings().engine.run_dir)
    status = run_dir.status()
    return expected_markdown(rows, status.expected if status else None, run_dir.plan())


async def say(text: str, elements: list[cl.Element] | None = None) -> None:
    await cl.Message(content=text, elements=elements or [], metadata={PANEL_KEY: COMMAND}).send()


def keep_timing(
    reply: cl.Message,
    result: ChatResult,
    target: Target | None,
    all_chats: AllChats,
    starts: EngineStarts,
    *,
    stopped: bool = False,
    setup: str = PLAN_LABEL,
) -> str:
    """Keep the reply's row in its metadata (stored with the message) and in the user's series of
    this page; returns the footer's split. Called once the reply is whole, off the first token's way.
    ``setup``: which of two compared setups wrote the reply (``up --compare``)."""
    first = starts.first(target.base_url, target.started_at) if target is not None else False
    chat = cl.context.session.thread_id or cl.context.session.id
    row = timing_row(
        result, reply=len(chat_rows()) + 1, chat=chat[:8], first_after_start=first, stopped=stopped, setup=setup
    )
    reply.metadata = {**(reply.metadata or {}), TIMING_KEY: row}
    all_chats.add(user_key(), row)
    return split_line(row)
