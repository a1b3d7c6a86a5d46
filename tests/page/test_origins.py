"""The chat page answers its own address and the origins ``app.allowed_origins`` lists, nothing else
(``backend/page/guards/origins.py``): a page served from another port of the same host, opened in a real
headless chromium that holds the user's login, reads no chat over HTTP nor over the socket, on loopback
without login (the local user) and behind the login; a listed origin reads them.

The chats are written into the page's SQLite file before it starts, and the pages run without an engine
(reading chats needs none).
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.browser import launch, needs_chromium
from support.chats import seed_chats
from support.ports import free_port

from backend.page.chats.database import async_url
from backend.page.chats.identity import LOCAL_USER
from backend.runtime.up import ChatPage

SECRET = "s" * 48
USERS = {"ann": "tulip-orbit-canvas-41"}

READ = """
async ([page, threadId]) => {
  const out = {listed: 0, listError: "", steps: 0, socket: ""};
  try {
    const r = await fetch(page + "/project/threads", {
      method: "POST", credentials: "include", headers: {"content-type": "application/json"},
      body: JSON.stringify({pagination: {first: 100}, filter: {}}),
    });
    out.listed = (await r.json()).data.length;
  } catch (err) {
    out.listError = String(err);
  }
  out.socket = await new Promise((resolve) => {
    const ws = new WebSocket(page.replace("http", "ws") + "/ws/socket.io/?EIO=4&transport=websocket");
    const auth = {clientType: "webapp", sessionId: crypto.randomUUID(), threadId, userEnv: "{}", chatProfile: ""};
    const give = (why) => { try { ws.close(); } catch (e) {} resolve(why); };
    setTimeout(() => give("no answer"), 120000);
    ws.onerror = () => give("refused");
    ws.onclose = () => give("closed");
    ws.onmessage = (event) => {
      const data = String(event.data);
      if (data === "2") ws.send("3");
      else if (data.startsWith("0")) ws.send("40" + JSON.stringify(auth));
      else if (data.startsWith("44")) give("not connected: " + data);
      else if (data.startsWith("40")) ws.send('42["connection_successful"]');
      else if (data.startsWith('42["resume_thread"')) {
        out.steps = JSON.parse(data.slice(2))[1].steps.length;
        give("resumed");
      }
    };
  });
  return out;
}
"""
"""Run in the other origin's page: the user's chats listed over HTTP with the browser's credentials, and
one of them reopened over the socket (engine.io 4 on a plain WebSocket, as Chainlit's client speaks it)."""


class OtherSite:
    """A page served from another port of the same host: a blank HTML page, at ``url``."""

    def __init__(self) -> None:
        body = b"<!doctype html><title>another site</title><p>another site</p>"

        class Blank(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Blank)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sites() -> Iterator[tuple[OtherSite, OtherSite]]:
    """Two other sites on this host: the first is listed in the pages' ``app.allowed_origins``."""
    listed, unlisted = OtherSite(), OtherSite()
    yield listed, unlisted
    listed.close()
    unlisted.close()


def _read_from(browser: Any, site: OtherSite, page_url: str, thread_id: str, login: str | None = None) -> Any:
    """What a script on ``site`` reads of the page at ``page_url`` in a browser holding the page's login."""
    context = browser.new_context()
    try:
        if login is not None:
            r = context.request.post(f"{page_url}/login", form={"username": login, "password": USERS[login]})
            assert r.ok, r.text()
        tab = context.new_page()
        tab.goto(site.url)
        return tab.evaluate(READ, [page_url, thread_id])
    finally:
        context.close()


@needs_chromium
def test_another_origin_reads_no_chat_with_or_without_login_and_a_listed_one_does(
    page_without_engine: Callable[..., ChatPage], tmp_path: Path, sites: tuple[OtherSite, OtherSite]
) -> None:
    from playwright.sync_api import sync_playwright

    listed, unlisted = sites
    local_db, login_db = tmp_path / "local.db", tmp_path / "login.db"
    local_chats = [c.thread for c in seed_chats(async_url(f"sqlite:///{local_db}"), LOCAL_USER, 3)]
    ann_chats = [c.thread for c in seed_chats(async_url(f"sqlite:///{login_db}"), "ann", 2)]
    allowed = json.dumps([listed.url])
    local = page_without_engine(
        ERNIECHAT_APP__DATABASE_URL=f"sqlite:///{local_db}", ERNIECHAT_APP__ALLOWED_ORIGINS=allowed
    )
    behind_login = page_without_engine(
        ERNIECHAT_APP__DATABASE_URL=f"sqlite:///{login_db}",
        ERNIECHAT_APP__ALLOWED_ORIGINS=allowed,
        ERNIECHAT_APP__USERS=json.dumps(USERS),
        ERNIECHAT_APP__AUTH_SECRET=SECRET,
    )
    own = httpx.post(f"{local.url}/project/threads", json={"pagination": {"first": 100}, "filter": {}}, timeout=60)
    assert own.status_code == 200 and len(own.json()["data"]) == 3, "the page's own address reads its chats"
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            for page, chat, login, count in (
                (local, local_chats[0], None, 3),
                (behind_login, ann_chats[0], "ann", 2),
            ):
                read = _read_from(browser, unlisted, page.url, chat, login)
                assert read["listed"] == 0 and read["steps"] == 0, (page.url, login, read)
                assert read["socket"] != "resumed", read
                read = _read_from(browser, listed, page.url, chat, login)
                assert read["listed"] == count and read["steps"] == 2, (page.url, login, read)
        finally:
            browser.close()
    refused = httpx.get(f"{local.url}/user", headers={"Origin": unlisted.url}, timeout=60)
    assert refused.status_code == 403 and unlisted.url in refused.text, refused.text
    assert not [h for h in refused.headers if h.startswith("access-control-")], refused.headers


def test_a_page_named_by_another_host_name_is_not_the_local_user(page_without_engine: Callable[..., ChatPage]) -> None:
    """A web page whose own name was made to resolve to this machine (DNS rebinding) sends its name as
    the Host, and is same-origin with itself: on loopback without login it gets nobody, not the local
    user and their chats."""
    page = page_without_engine()
    port = page.url.rsplit(":", 1)[1]
    assert httpx.get(f"{page.url}/user", timeout=60).json()["identifier"] == LOCAL_USER
    for host in (f"rebound.example:{port}", "rebound.example"):
        r = httpx.get(f"{page.url}/user", headers={"Host": host, "Origin": f"http://{host}"}, timeout=60)
        assert r.status_code == 401, (host, r.status_code, r.text)
