"""The product's page client (``backend.page_client.PageSession``) with what tests look at: every
step the tab was shown, the actions and files it holds, and the clicks and commands a person
makes. The page answers with ``new_message`` / ``stream_start`` / ``stream_token`` /
``update_message`` / ``action`` and brackets each handler run with ``task_start`` / ``task_end``;
an action button is an HTTP ``POST /project/action``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx

from backend.errors import PageError
from backend.page_client import PageSession, user_message

FOOTER = re.compile(r"TTFT (\d+) ms \(engine (\d+) ms\) · (\d+) tokens · ([\d.]+) tok/s")
"""The page's latency footer under a reply."""


def footer_of(reply: dict[str, Any]) -> tuple[int, int, float]:
    """(TTFT ms, tokens, tokens/s) from a reply's footer; fails when it has none."""
    m = FOOTER.search(reply["output"])
    assert m, f"no latency footer in {reply['output'][-200:]!r}"
    assert int(m.group(2)) <= int(m.group(1)), "the engine's share cannot exceed what the user waited"
    return int(m.group(1)), int(m.group(3)), float(m.group(4))


class ChatClient:
    """One browser tab: its own session id, the steps it was shown, the actions it holds."""

    def __init__(
        self,
        url: str,
        session_id: str | None = None,
        source: str | None = None,
        thread_id: str = "",
        cookie: str | None = None,
    ) -> None:
        """``session_id`` of an earlier tab: this one reconnects to that session, as a browser does.
        ``source``: the client address this tab's socket and clicks come from (default: any).
        ``thread_id``: a past chat to reopen (the sidebar's link); ``cookie``: a login's ``Cookie`` header."""
        self.tab = PageSession(
            url, cookie=cookie, source=source, session_id=session_id, thread_id=thread_id, watch=self._record
        )
        self.url, self.session_id, self.source, self.sio = self.tab.url, self.tab.session_id, source, self.tab.sio
        self.steps: dict[str, dict[str, Any]] = {}
        """Messages by id, as the page would show them (stream tokens applied)."""
        self.order: list[str] = []
        self.events: list[tuple[str, Any]] = []
        self.tokens: dict[str, int] = {}
        """stream_token events per message id."""
        self.actions: list[dict[str, Any]] = []
        self.elements: list[dict[str, Any]] = []
        """Files and images the page attached to its messages (``forId``: the message)."""
        self.task_ends = 0
        self.finished: set[str] = set()
        """Handler runs that have ended: ``on_chat_start``, and the ids of messages ``on_message`` answered."""

    def _record(self, name: str, data: Any) -> None:
        self.events.append((name, data))
        if name == "update_message" and data.get("type") == "run":
            self.finished.add(data.get("parentId") or data.get("name", ""))
        if name in ("new_message", "update_message", "stream_start"):
            if data["id"] not in self.steps:
                self.order.append(data["id"])
            self.steps[data["id"]] = dict(data)
        elif name == "stream_token":
            step = self.steps.setdefault(data["id"], {"id": data["id"], "output": ""})
            step["output"] = data["token"] if data.get("isSequence") else step.get("output", "") + data["token"]
            self.tokens[data["id"]] = self.tokens.get(data["id"], 0) + 1
        elif name == "delete_message":
            self.steps.pop(data["id"], None)
        elif name == "action":
            self.actions.append(data)
        elif name == "element":
            self.elements.append(data)
        elif name == "remove_action":
            self.actions = [a for a in self.actions if a["id"] != data["id"]]
        elif name == "task_end":
            self.task_ends += 1

    # -- connection ------------------------------------------------------------------------
    async def connect(self, timeout: float = 120, wait_start: bool = True) -> ChatClient:
        """Open the tab; with ``wait_start``, return once ``on_chat_start`` has finished (a past
        chat: once the page has sent it back)."""
        await self.tab.connect(timeout, wait_start)
        return self

    def seen(self, event: str) -> list[Any]:
        """The data of each ``event`` the page sent so far."""
        return [data for name, data in self.events if name == event]

    async def close(self) -> None:
        await self.tab.close()

    async def __aenter__(self) -> ChatClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_for(self, predicate: Callable[[], Any], timeout: float) -> Any:
        """Until ``predicate()`` is truthy (checked after each event), then its value; AssertionError,
        with the replies shown, after ``timeout``."""
        try:
            return await self.tab.wait_for(predicate, timeout)
        except PageError as err:
            raise AssertionError(f"{err}; messages: {self.texts()}") from None

    # -- what the page shows ---------------------------------------------------------------
    def messages(self, type_: str = "assistant_message") -> list[dict[str, Any]]:
        return [self.steps[i] for i in self.order if i in self.steps and self.steps[i].get("type") == type_]

    def texts(self) -> list[str]:
        return [m.get("output", "") for m in self.messages()]

    @property
    def stop_shown(self) -> bool:
        """Whether the page shows its Stop button: the latest of ``task_start`` and ``task_end`` was a start."""
        marks = [name for name, _ in self.events if name in ("task_start", "task_end")]
        return bool(marks) and marks[-1] == "task_start"

    def reply_to(self, message_id: str) -> dict[str, Any] | None:
        """The latest reply to a sent message (a Retry answers it again)."""
        replies = [m for m in self.messages() if (m.get("metadata") or {}).get("in_reply_to") == message_id]
        return replies[-1] if replies else None

    def history_of(self, message_id: str) -> list[str]:
        """Every text a message has shown, in order (new, streamed, updated)."""
        return [
            d.get("output") or ""
            for name, d in self.events
            if name in ("new_message", "update_message", "stream_start") and d.get("id") == message_id
        ]

    # -- what a person does ----------------------------------------------------------------
    async def send(self, text: str) -> str:
        """Type and send a message; returns its id (the reply's ``metadata.in_reply_to``)."""
        return await self.tab.send(user_message(text))

    async def ask(self, text: str, timeout: float = 120) -> dict[str, Any]:
        """Send and wait until ``on_message`` has finished with it; the reply to this message."""
        mid = await self.send(text)
        await self.wait_for(lambda: mid in self.finished, timeout)
        reply = self.reply_to(mid)
        assert reply is not None, f"no reply to {text[:40]!r}; messages: {self.texts()}"
        return reply

    async def command(self, name: str, text: str = "", timeout: float = 120) -> str:
        """Pick ``/name`` in the message box's command menu and send ``text`` with it; returns once
        the page has handled it, with the message's id."""
        mid = await self.tab.send({**user_message(text), "command": name})
        await self.wait_for(lambda: mid in self.finished, timeout)
        return mid

    async def file(self, element: dict[str, Any]) -> bytes:
        """The content of a file the page attached, fetched as the browser's download link does."""
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.get(
                f"{self.url}/project/file/{element['chainlitKey']}", params={"session_id": self.session_id}
            )
        r.raise_for_status()
        return r.content

    async def stop(self) -> None:
        """The stop button."""
        await self.tab.stop()

    async def set_settings(self, **values: Any) -> None:
        """The chat settings panel's Confirm."""
        await self.tab.set_settings(**values)

    async def post_action(self, action: dict[str, Any], timeout: float = 120) -> httpx.Response:
        """The HTTP request an action button sends, from this tab's address."""
        transport = httpx.AsyncHTTPTransport(local_address=self.source) if self.source else None
        async with httpx.AsyncClient(timeout=timeout, transport=transport) as http:
            return await http.post(f"{self.url}/project/action", json={"sessionId": self.session_id, "action": action})

    async def click(self, action: dict[str, Any], timeout: float = 120) -> None:
        """An action button; returns when the handler it started has ended."""
        ends = self.task_ends
        r = await self.post_action(action, timeout)
        r.raise_for_status()
        await self.wait_for(lambda: self.task_ends > ends, timeout)
