"""One real browser (Debian's chromium, driven by Playwright) walks what a person does: types,
watches replies stream in with their latency footers, runs ``/latency`` from the message box,
downloads its CSV, and after a restart of the page reopens the chat from the history sidebar and
goes on. Saves the page to the test's tmp dir, and to ``docs/screenshot.png`` when
``UPDATE_SCREENSHOT=1`` (so a test run leaves the tracked tree alone)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.app_client import FOOTER
from support.browser import download_csv, footers_of, launch, needs_chromium, send_and_wait
from support.chats import seed_chats
from support.page import start_page
from support.services import ROOT

from backend.page.chats.database import async_url
from backend.page.chats.identity import LOCAL_USER
from backend.page.chats.partial import NOTE
from backend.page.latency import COLUMNS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from playwright.sync_api import WebSocketRoute
    from support.services import Engine

    from backend.runtime.up import ChatPage


REPLY_TOKENS = 32
"""Every reply's length: the page's max_tokens, reached by greedy decoding of these prompts."""
PROMPT = re.compile(r"\((\d+) of (\d+) prompt tokens cached\)")
"""The footer's prompt tokens (cached of all)."""


@pytest.fixture
def greedy_page(engine: Engine, tmp_path: Path) -> Iterator[ChatPage]:
    """The page's defaults made greedy: the demo model's sampled reply to this prompt sometimes ends
    after one token (a fresh-clone run showed "1 tokens"), and a streamed reply needs a length.
    Its chats are kept in the test's own SQLite file, so its history sidebar lists this test's only."""
    page = start_page(
        engine.run_dir,
        tmp_path / "chainlit.log",
        ERNIECHAT_APP__TEMPERATURE="0",
        ERNIECHAT_APP__MAX_TOKENS=str(REPLY_TOKENS),
        ERNIECHAT_APP__DATABASE_URL=f"sqlite:///{tmp_path / 'chats.db'}",
    )
    yield page
    page.stop()


def streamed(frames: list[str]) -> None:
    """The reply's first text reached the browser as a stream event before the message with its
    footer. (The order, not a count of events: how many a reply takes depends on how fast the
    engine is against the page's 30 ms joining.)"""
    started = next((i for i, f in enumerate(frames) if "stream_start" in f), None)
    finished = next((i for i, f in enumerate(frames) if "update_message" in f and "tok/s" in f), None)
    events = [name for f in frames for name in ("stream_start", "stream_token", "update_message") if name in f]
    assert started is not None and finished is not None and started < finished, (
        f"the browser got the reply in one piece, not streamed (events: {events})"
    )


@needs_chromium
def test_browser_chats_reads_latency_downloads_its_csv_and_reopens_the_chat_after_a_restart(
    greedy_page: ChatPage, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    first, second, later = (
        "Hello! What can you tell me about rivers?",
        "And what about lakes?",
        "Tell me about mountains.",
    )
    frames: list[str] = []
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(str(f))))
            page.goto(greedy_page.url)
            page.locator("#chat-input").wait_for(timeout=60_000)
            expect(page.get_by_text("Demo model: random weights.")).to_be_visible(timeout=30_000)

            # 1. two messages, each answered with a streamed reply of REPLY_TOKENS tokens
            send_and_wait(page, first, 1, REPLY_TOKENS)
            streamed(frames)
            # Chainlit scrolls a sent message to the top; scroll back so the banner shows too
            page.mouse.move(640, 300)
            page.mouse.wheel(0, -5000)
            page.wait_for_timeout(500)
            shot = tmp_path / "screenshot.png"
            page.screenshot(path=str(shot))
            send_and_wait(page, second, 2, REPLY_TOKENS)
            footers = footers_of(page)
            chat_url = page.url
            assert "/thread/" in chat_url, f"the chat has no address of its own: {chat_url}"

            # 2. /latency picked from the message box's command menu: the panel with a row per reply
            page.locator("#chat-input").fill("/lat")
            page.get_by_role("option").filter(has_text="This chat's latency").click()
            page.locator("#chat-input").press("Enter")
            panel = page.locator('[data-step-type="assistant_message"]').filter(has_text="Latency, this chat:")
            expect(panel).to_contain_text("2 replies", timeout=60_000)
            summary, table = panel.locator("table").nth(0), panel.locator("table").nth(1)
            expect(summary.locator("thead th")).to_have_text(["figure", "count", "min", "p50", "p90", "p99", "max"])
            expect(summary.locator("tbody tr").first).to_contain_text("TTFT (ms)")
            expect(table.locator("tbody tr")).to_have_count(2)
            expect(panel.locator("img[alt='latency.png']")).to_be_visible()

            # 3. the CSV through the browser's download: a header and one row per reply, the footers' TTFT
            header, rows = download_csv(page, panel, tmp_path)
            assert header == COLUMNS, header
            assert [(r["reply"], r["output_tokens"]) for r in rows] == [
                ("1", str(REPLY_TOKENS)),
                ("2", str(REPLY_TOKENS)),
            ]
            # the CSV keeps 0.1 ms, the footer whole ms, both from one measurement: at most 0.55 ms apart
            gaps = [abs(float(r["ttft_ms"]) - int(m.group(1))) for r, m in zip(rows, footers, strict=True)]
            assert max(gaps) <= 0.55, f"the CSV's TTFT is not the footers': {gaps}"

            # 4. the page's process restarted; the browser loads the page afresh and reopens the chat
            greedy_page.restart()
            why = greedy_page.wait_serving()
            assert why is None, why
            page.goto(greedy_page.url)
            page.locator("#thread-history").get_by_text(first, exact=True).click(timeout=60_000)
            expect(page).to_have_url(chat_url, timeout=30_000)
            for text in (first, second):
                sent = page.locator('[data-step-type="user_message"]').get_by_text(text, exact=True)
                expect(sent).to_be_visible(timeout=60_000)
            reopened = footers_of(page)
            assert [m.group(0) for m in reopened] == [m.group(0) for m in footers], "the footers came back as shown"
            frames.clear()
            send_and_wait(page, later, 3, REPLY_TOKENS)
            streamed(frames)
            # the earlier turns went into the prompt again: the model's history was rebuilt from the store
            prompts = [int(m.group(2)) for m in PROMPT.finditer(" ".join(page.get_by_text(FOOTER).all_inner_texts()))]
            assert len(prompts) == 3 and prompts[2] > prompts[1] > prompts[0], prompts
        finally:
            browser.close()
    if os.environ.get("UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "screenshot.png")


class HeldSocket:
    """The page's socket held back until :meth:`release`: a slow connection, so that a message
    is sent before it is up on every load (a fast one makes that a race of a few hundred ms)."""

    def __init__(self) -> None:
        self.held: list[WebSocketRoute] = []
        self.released = False

    def route(self, ws: WebSocketRoute) -> None:
        if self.released:
            ws.connect_to_server()
        else:
            self.held.append(ws)

    def release(self) -> None:
        self.released = True
        for ws in self.held:
            ws.connect_to_server()


@needs_chromium
def test_browser_message_sent_before_the_socket_is_up_is_kept_then_answered(greedy_page: ChatPage) -> None:
    """Sent the instant the box shows, before the socket is connected: the message stays in the
    box under a notice, then is sent once (the composer ignored Enter until then, and the
    welcome box it was typed in is replaced when the page's first message arrives)."""
    from playwright.sync_api import expect, sync_playwright

    text = "Tell me about lakes."
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            for _ in range(3):  # three page loads
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                socket = HeldSocket()
                page.route_web_socket(lambda url: "/ws/socket.io/" in url, socket.route)
                page.goto(greedy_page.url)
                box = page.locator("#chat-input")
                box.wait_for(timeout=60_000)
                box.fill(text)
                box.press("Enter")
                notice = page.locator("#erniechat-pending")
                expect(notice).to_contain_text("will be sent as soon as the page is connected")
                expect(box).to_have_value(text)
                socket.release()
                footer = page.get_by_text(FOOTER).filter(has_text="· 32 tokens ·")  # the page's max_tokens here
                expect(footer).to_be_visible(timeout=120_000)
                sent = page.locator('[data-step-type="user_message"]').get_by_text(text, exact=True)
                expect(sent).to_have_count(1)  # sent once (the sidebar may also list the chat by its first words)
                expect(box).to_have_value("")
                expect(notice).to_have_count(0)
                page.close()
        finally:
            browser.close()


@needs_chromium
def test_browser_shows_a_setting_value_a_script_sent_as_text_not_a_link(
    page_without_engine: Callable[..., ChatPage],
) -> None:
    """A script's temperature ``[x](javascript:alert(1))`` is echoed in the page's sentence about it; the
    browser shows the characters, not a link (it was rendered as Markdown: a link named "x")."""
    from playwright.sync_api import expect, sync_playwright

    page_url = page_without_engine().url
    value = "[x](javascript:alert(1))"
    frames: list[str] = []
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page()
            to_page: list[WebSocketRoute] = []
            page.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(str(f))))
            page.route_web_socket(
                lambda url: "/ws/socket.io/" in url, lambda ws: to_page.append(ws.connect_to_server())
            )
            page.goto(page_url)
            page.locator("#chat-input").wait_for(timeout=60_000)
            for _ in range(600):  # the chat has started once its settings arrived (Playwright's events come meanwhile)
                if any('"chat_settings"' in f for f in frames):
                    break
                page.wait_for_timeout(100)
            to_page[0].send('42["chat_settings_change",' + json.dumps({"temperature": value}) + "]")
            notice = page.locator('[data-step-type="assistant_message"]').filter(has_text="is not a number")
            expect(notice).to_contain_text(f'Temperature "{value}" is not a number', timeout=60_000)
            expect(notice.locator("a")).to_have_count(0)
        finally:
            browser.close()


@needs_chromium
def test_browser_reopens_a_reply_the_pages_death_cut_off_with_its_note_and_retry(
    page_without_engine: Callable[..., ChatPage], tmp_path: Path
) -> None:
    """A chat whose reply a page process that died mid-reply left (its text, the note, marked interrupted):
    the browser reopens it with the question, the reply so far, the note, and a Retry button under it
    (sent once the chat is shown: Chainlit replaces what the tab showed before with the stored chat)."""
    from playwright.sync_api import expect, sync_playwright

    db = tmp_path / "chats.db"
    (chat,) = seed_chats(async_url(f"sqlite:///{db}"), LOCAL_USER, 1, cut_off=True)
    page_url = page_without_engine(ERNIECHAT_APP__DATABASE_URL=f"sqlite:///{db}").url
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page()
            page.goto(f"{page_url}/thread/{chat.thread}")
            reply = page.locator('[data-step-type="assistant_message"]').filter(has_text="an answer 0")
            expect(reply).to_contain_text(NOTE, timeout=60_000)
            expect(page.locator('[data-step-type="user_message"]').get_by_text("a question 0")).to_be_visible()
            expect(page.get_by_role("button", name="Retry")).to_have_count(1, timeout=60_000)
        finally:
            browser.close()
