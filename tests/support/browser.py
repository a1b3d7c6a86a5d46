"""A real browser for the page's tests: Debian's chromium driven by Playwright, and what a person does
in it (types a message and waits for its replies, reads the footers)."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.app_client import FOOTER

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page, Playwright

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


def send_and_wait(page: Page, text: str, replies: int, tokens: int) -> None:
    """Type ``text``, send it, and wait until the chat shows ``replies`` footers of a whole reply of
    ``tokens`` tokens and the task has ended."""
    from playwright.sync_api import expect

    box = page.locator("#chat-input")
    box.fill(text)
    box.press("Enter")
    sent = page.locator('[data-step-type="user_message"]').get_by_text(text, exact=True)
    expect(sent).to_be_visible(timeout=60_000)
    footers = page.get_by_text(FOOTER).filter(has_text=f"· {tokens} tokens ·")
    expect(footers).to_have_count(replies, timeout=120_000)
    expect(page.locator("#chat-submit")).to_be_visible(timeout=30_000)  # the task has ended


def footers_of(page: Page) -> list[re.Match[str]]:
    """The chat's footers, in order, as the browser shows them."""
    texts = page.get_by_text(FOOTER).all_inner_texts()
    found = [FOOTER.search(t) for t in texts]
    assert all(found), texts
    return [m for m in found if m]


def download_csv(page: Page, panel: Locator, folder: Path) -> tuple[tuple[str, ...], list[dict[str, str]]]:
    """Click the ``/latency`` panel's CSV link as a person would and read the file the browser saved:
    its header and its rows."""
    with page.expect_download(timeout=60_000) as download:
        panel.locator("a[download$='.csv']").click()
    saved = folder / download.value.suggested_filename
    download.value.save_as(saved)
    with saved.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    return tuple(reader.fieldnames or ()), rows
