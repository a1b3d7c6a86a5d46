"""Drive a running Chainlit page over its socket, as a browser tab does, and time each reply.

What the browser does (read from the installed ``chainlit/socket.py``, Chainlit 2.x): connect
to ``/ws/socket.io`` with the auth object ``{clientType, sessionId, threadId, userEnv,
chatProfile}`` (a login cookie, when the page has login, goes in the ``Cookie`` header), emit
``connection_successful`` (which runs ``on_chat_start``), then one ``client_message``
``{message: step, fileReferences: []}`` per message. The reply comes back as ``new_message``
(the empty reply, ``metadata.in_reply_to`` = our message id), ``stream_start`` (carrying the
first token), ``stream_token`` for the rest, then ``update_message`` with the footer; the
``on_message`` run step's ``update_message`` (``parentId`` = our id) and ``task_end`` close it.
A past chat is reopened with its id as the auth's ``threadId``: the page answers ``resume_thread``.
``stop`` is the Stop button; a ``command`` in the message step is the message box's command menu.

Times are taken as ``backend.engine_api`` takes them: from sending to the first token the page
shows. python-socketio is imported here only; bench imports this module only for ``--page``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from backend.engine_api import ChatResult
from backend.errors import PageError

SOCKET_PATH = "/ws/socket.io"
EVENTS = (
    "new_message",
    "update_message",
    "stream_start",
    "stream_token",
    "delete_message",
    "action",
    "remove_action",
    "task_start",
    "task_end",
    "chat_settings",
    "element",
    "resume_thread",
)
"""What the page sends a tab (Chainlit's ``emitter.py``)."""
UNSAVED_HEADER = "x-erniechat-unsaved"
"""A tab that sends this header (``1``) is not saved in the page's chat history: the page's own warm-up."""
NO_VISIBLE_REPLY = "the page answered without a reply"
"""How a reply with no visible text starts its error: no first token to time (random weights give some)."""


def loopback_sources(url: str, count: int, first: int = 1) -> list[str | None]:
    """``count`` client addresses for a page on this machine: 127.0.0.first onwards (all of
    127/8 is this machine on Linux), so that a page of several processes, which places each client
    address on one of them, sees that many clients. ``[None]`` (the default address) for a page
    elsewhere."""
    host = urlsplit(url).hostname or ""
    if not host.startswith("127."):
        return [None]
    return [f"127.0.0.{(first - 1 + k) % 254 + 1}" for k in range(count)]


def session_from(source: str | None, limit: int = 100) -> Any:
    """An aiohttp session whose connections come from the client address ``source`` (None: any),
    at most ``limit`` at once (0: no limit)."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, local_addr=(source, 0) if source else None)
    )


def browser_auth(session_id: str, thread_id: str = "") -> dict[str, str]:
    """The auth object Chainlit's react client sends (chainlit/socket.py ``connect`` reads it);
    ``thread_id``: the past chat to reopen ("" for a new one)."""
    return {
        "clientType": "webapp",
        "sessionId": session_id,
        "threadId": thread_id,
        "userEnv": "{}",
        "chatProfile": "",
    }


def user_message(text: str) -> dict[str, str]:
    """A typed message as the page's ``client_message`` carries it."""
    return {
        "id": str(uuid.uuid4()),
        "threadId": "",
        "name": "User",
        "type": "user_message",
        "output": text,
        "createdAt": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }


FOOTER_TOKENS = re.compile(r"· (\d+) tokens ·")
"""The page's footer carries the engine's own completion-token count."""
FOOTER_TTFT = re.compile(r"TTFT (\d+) ms \(engine (\d+) ms\)")
"""...and the first-token time the page measured (from the message reaching it), with the engine's share."""


@dataclass
class _Ask:
    """One message in flight and what the page has shown for it so far."""

    message_id: str
    t0: float
    reply_id: str | None = None
    result: ChatResult = field(default_factory=ChatResult)
    last_output: str = ""
    """Latest text of any message shown after sending (an error text when no reply streams)."""
    reply_output: str = ""
    """The reply as last shown whole (``update_message``): text, footer or error."""
    saw_task_start: bool = False
    done: bool = False


Watcher = Callable[[str, Any], None]
"""Told each event the page sends a tab: its name and data."""
T = TypeVar("T")


class PageSession:
    """One browser tab: its own session id; one message at a time, like a person."""

    def __init__(
        self,
        url: str,
        *,
        cookie: str | None = None,
        http_session: Any = None,
        source: str | None = None,
        session_id: str | None = None,
        thread_id: str = "",
        watch: Watcher | None = None,
        unsaved: bool = False,
    ) -> None:
        """``http_session``: an ``aiohttp.ClientSession`` to share with other tabs (one per tab when
        None); many tabs in one process each with its own session cost the client most of its CPU.
        ``source``: the client address to connect from (:func:`loopback_sources`), without a shared
        session. ``session_id`` of an earlier tab: this one reconnects to that session, as a browser
        does. ``thread_id``: a past chat to reopen (the sidebar's link). ``watch``: told every event
        after this tab has read it. ``unsaved``: the page keeps nothing of this chat (:data:`UNSAVED_HEADER`)."""
        try:
            import socketio
        except ImportError:
            raise PageError("python-socketio is not installed: pip install python-socketio") from None
        self.url = url.rstrip("/")
        self.cookie = cookie
        self.session_id = session_id or str(uuid.uuid4())
        self.thread_id = thread_id
        self.unsaved = unsaved
        extra: dict[str, Any] = {"http_session": http_session} if http_session is not None else {}
        if source is not None and http_session is None:
            extra["http_session"] = functools.partial(session_from, source)  # engineio makes and closes it
        self.sio = socketio.AsyncClient(reconnection=False, **extra)
        self.chat_started = False
        self.chat_resumed = False
        self.shown_ttft_ms: tuple[int, int] | None = None
        """The last reply's footer: (the page's TTFT, the engine's share) in ms; None without one."""
        self._ask: _Ask | None = None
        self._watch = watch
        self._changed = asyncio.Event()
        for name in EVENTS:
            self.sio.on(name, self._handler(name))

    # -- events ----------------------------------------------------------------------------
    def _handler(self, name: str) -> Callable[[Any], Any]:
        async def handle(data: Any = None) -> None:
            self._on(name, data if isinstance(data, dict) else {})
            if self._watch is not None:
                self._watch(name, data)
            self._changed.set()

        return handle

    def _on(self, name: str, data: dict[str, Any]) -> None:
        now = time.perf_counter()
        if name == "update_message" and data.get("type") == "run" and data.get("name") == "on_chat_start":
            self.chat_started = True
        self.chat_resumed |= name == "resume_thread"
        ask = self._ask
        if ask is None or ask.done:
            return
        res = ask.result
        if name in ("new_message", "update_message", "stream_start"):
            if data.get("type") == "run":
                if data.get("parentId") == ask.message_id and name == "update_message":
                    self._finish(ask, now)
                return
            if (data.get("metadata") or {}).get("in_reply_to") == ask.message_id:
                ask.reply_id = data.get("id")
            if data.get("output"):
                ask.last_output = str(data["output"])
                if data.get("id") == ask.reply_id and name == "update_message":
                    ask.reply_output = ask.last_output
            if name == "stream_start" and data.get("id") == ask.reply_id and data.get("output"):
                self._token(res, str(data["output"]), now - ask.t0, sequence=True)
        elif name == "stream_token" and data.get("id") == ask.reply_id and data.get("token"):
            self._token(res, str(data["token"]), now - ask.t0, sequence=bool(data.get("isSequence")))
        elif name == "task_start":
            ask.saw_task_start = True
        elif name == "task_end" and ask.saw_task_start:
            self._finish(ask, now)

    @staticmethod
    def _token(res: ChatResult, token: str, at: float, *, sequence: bool) -> None:
        if res.ttft_s is None:
            res.ttft_s = at
        res.token_times.append(at)
        res.text = token if sequence else res.text + token

    @staticmethod
    def _finish(ask: _Ask, now: float) -> None:
        res = ask.result
        res.total_s = now - ask.t0
        counted = FOOTER_TOKENS.search(ask.reply_output)
        res.tokens = int(counted.group(1)) if counted else len(res.token_times)
        if not res.token_times:
            shown = ask.last_output.strip().splitlines()[:1]
            res.error = f"{NO_VISIBLE_REPLY}: {shown[0][:200] if shown else 'nothing shown'}"
        elif "⚠️" in ask.reply_output and not counted:
            res.error = f"the page reported an error: {ask.reply_output.split('⚠️', 1)[1].strip()[:200]}"
        ask.done = True

    async def wait_for(self, predicate: Callable[[], T], timeout: float, what: str = "show it") -> T:
        """Until ``predicate()`` is truthy (checked after each event), then its value; PageError
        saying that the page did not ``what`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not (value := predicate()):
            left = deadline - time.monotonic()
            if left <= 0:
                raise PageError(f"the page at {self.url} did not {what} within {timeout:.0f} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
        return value

    # -- what a person does ----------------------------------------------------------------
    async def connect(self, timeout: float = 60.0, wait_start: bool = True) -> PageSession:
        """Open the tab (or raise PageError); with ``wait_start``, return once ``on_chat_start`` has
        run (a past chat: once the page has sent it back). Without: once the socket is open (a tab
        back to its session, for which the page starts nothing)."""
        import socketio

        try:
            await self.sio.connect(
                self.url,
                socketio_path=SOCKET_PATH,
                transports=["websocket"],
                headers={
                    **({"Cookie": self.cookie} if self.cookie else {}),
                    **({UNSAVED_HEADER: "1"} if self.unsaved else {}),
                },
                auth=browser_auth(self.session_id, self.thread_id),
                wait_timeout=timeout,
            )
        except (socketio.exceptions.ConnectionError, OSError) as err:
            await self.close()  # also frees the HTTP session of a connection that never opened
            raise PageError(f"cannot open the chat page's socket at {self.url}{SOCKET_PATH}: {err}") from None
        try:
            await self.sio.emit("connection_successful")
            if wait_start and self.thread_id:
                await self.wait_for(lambda: self.chat_resumed, timeout, "reopen the chat (resume_thread)")
            elif wait_start:
                await self.wait_for(lambda: self.chat_started, timeout, "start the chat (on_chat_start)")
        except BaseException:
            await self.close()
            raise
        return self

    async def set_settings(self, **values: Any) -> None:
        """The chat settings panel's Confirm (e.g. ``max_tokens``, ``temperature``)."""
        await self.sio.emit("chat_settings_change", values)

    async def send(self, step: dict[str, str]) -> str:
        """Send a message step (:func:`user_message`); its id, which the reply's
        ``metadata.in_reply_to`` names."""
        await self.sio.emit("client_message", {"message": step, "fileReferences": []})
        return step["id"]

    async def stop(self) -> None:
        """The Stop button: the page stops the handler that runs (a reply streaming)."""
        await self.sio.emit("stop")

    async def ask(self, text: str, timeout: float = 300.0) -> ChatResult:
        """Send a message and wait for the whole reply; its timings as a ChatResult."""
        step = user_message(text)
        ask = _Ask(message_id=step["id"], t0=time.perf_counter())
        self._ask = ask
        try:
            await self.send(step)
            await self.wait_for(lambda: ask.done, timeout, "finish its reply")
        except PageError as err:
            ask.result.error = str(err)
            ask.result.total_s = time.perf_counter() - ask.t0
            if self.sio.connected:
                await self.stop()
        finally:
            self._ask = None
        shown = FOOTER_TTFT.search(ask.reply_output)
        self.shown_ttft_ms = (int(shown.group(1)), int(shown.group(2))) if shown else None
        return ask.result

    async def close(self) -> None:
        """Close the tab (the page keeps its session for ``session_timeout``, as for a browser)."""
        with contextlib.suppress(Exception):
            await self.sio.disconnect()
        with contextlib.suppress(Exception):
            await self.sio.eio.disconnect(abort=True)
