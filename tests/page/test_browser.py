"""One real browser (Debian's chromium, driven by Playwright): type, watch the reply stream in,
see its latency footer. Saves the page to the test's tmp dir, and to ``docs/screenshot.png`` when
``UPDATE_SCREENSHOT=1`` (so a test run leaves the tracked tree alone)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.app_client import FOOTER
from support.page import start_page
from support.services import ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator

    from playwright.sync_api import Browser, Playwright, WebSocketRoute
    from support.services import Engine

    from backend.runtime.up import ChatPage


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium: apt-get install -y chromium"
)


def launch(pw: Playwright) -> Browser:
    return pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


@pytest.fixture
def greedy_page(engine: Engine, tmp_path: Path) -> Iterator[ChatPage]:
    """The page's defaults made greedy: the demo model's sampled reply to this prompt sometimes ends
    after one token (a fresh-clone run showed "1 tokens"), and a streamed reply needs a length."""
    page = start_page(engine.run_dir, tmp_path / "chainlit.log", ERNIECHAT_APP__TEMPERATURE="0")
    yield page
    page.stop()


@needs_chromium
def test_browser_types_and_sees_streamed_reply_with_footer(greedy_page: ChatPage, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    frames: list[str] = []
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(str(f))))
            page.goto(greedy_page.url)
            box = page.locator("#chat-input")
            box.wait_for(timeout=60_000)
            expect(page.get_by_text("Demo model: random weights.")).to_be_visible(timeout=30_000)
            box.fill("Hello! What can you tell me about rivers?")
            box.press("Enter")
            expect(page.get_by_text("Hello! What can you tell me about rivers?")).to_be_visible(timeout=60_000)
            footer = page.get_by_text(FOOTER).filter(has_text="· 32 tokens ·")  # the page's max_tokens here
            expect(footer).to_be_visible(timeout=120_000)
            expect(page.locator("#chat-submit")).to_be_visible(timeout=30_000)  # the task has ended
            # Chainlit scrolls a sent message to the top; scroll back so the banner shows too
            page.mouse.move(640, 300)
            page.mouse.wheel(0, -5000)
            page.wait_for_timeout(500)
            shot = tmp_path / "screenshot.png"
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    # Streamed: the reply's first text reached the browser as a stream event before the message
    # with its footer. (The order, not a count of events: how many a 32-token reply takes depends
    # on how fast the engine is against the page's 30 ms joining.)
    started = next((i for i, f in enumerate(frames) if "stream_start" in f), None)
    finished = next((i for i, f in enumerate(frames) if "update_message" in f and "tok/s" in f), None)
    events = [name for f in frames for name in ("stream_start", "stream_token", "update_message") if name in f]
    assert started is not None and finished is not None and started < finished, (
        f"the browser got the reply in one piece, not streamed (events: {events})"
    )
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
