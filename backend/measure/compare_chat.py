"""One user's chat through the page against two compared setups (``up --compare``), and its ``/latency``.

A tab of the page (``page_client.PageSession``) sends ``messages`` messages one after the other, each
asked for ``tokens`` reply tokens at temperature 0 with Compare on, so the page answers each with both
setups in turn; then it asks ``/latency`` and downloads what the panel offers: the CSV and JSON with a
row per reply and its setup, and the panel's own text. The page cannot ask vLLM to ignore the end of a
reply, so a reply may end early; the demo model's random weights almost never do. ``benchmarks/compare.sh``
runs it on a GPU.
"""

from __future__ import annotations

import asyncio
import csv
import io
from dataclasses import dataclass, field
from typing import Any

import httpx

from backend.errors import MeasureError, PageError
from backend.page_client import PageSession, user_message
from backend.prompts import prompt_of

PROMPT_WORDS = 40
"""Each message's length in words (its own nonce first, so no message is another's prefix)."""
LATENCY = "latency"


@dataclass
class ChatLatency:
    """What one chat measured: the panel's text, its files by name, and the replies that ended early."""

    panel: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    short: list[str] = field(default_factory=list)
    """Rows (``reply setup: tokens``) whose reply has fewer tokens than asked."""

    def rows(self) -> list[dict[str, str]]:
        """The CSV's rows."""
        text = next((v for k, v in self.files.items() if k.endswith(".csv")), b"").decode()
        return list(csv.DictReader(io.StringIO(text)))


async def chat_latency(url: str, messages: int, tokens: int, timeout: float = 600.0) -> ChatLatency:
    """Chat ``messages`` messages of ``tokens`` reply tokens through the page at ``url``, then its
    ``/latency``; MeasureError when a message fails or the panel offers no files."""
    elements: list[dict[str, Any]] = []
    shown: dict[str, str] = {}

    def watch(name: str, data: Any) -> None:
        if name == "element" and isinstance(data, dict):
            elements.append(data)
        elif name in ("new_message", "update_message") and isinstance(data, dict) and data.get("output"):
            shown[str(data.get("id"))] = str(data["output"])

    tab = PageSession(url, watch=watch)
    await tab.connect()
    try:
        await tab.set_settings(max_tokens=tokens, temperature=0.0, compare=True)
        for i in range(messages):
            res = await tab.ask(f"Message {i + 1}. {prompt_of(PROMPT_WORDS)}", timeout)
            if res.error:
                raise MeasureError(f"message {i + 1} of {messages} failed through the page: {res.error}")
        step = {**user_message(""), "command": LATENCY}
        await tab.send(step)

        def offered() -> list[dict[str, Any]]:
            files = [e for e in elements if str(e.get("name", "")).endswith((".csv", ".json"))]
            return files if len(files) >= 2 else []

        try:
            files = await tab.wait_for(offered, timeout, "offer /latency's CSV and JSON")
        except PageError as err:
            raise MeasureError(str(err)) from None
        out = ChatLatency(panel=shown.get(str(files[0].get("forId")), ""))
        async with httpx.AsyncClient(timeout=60) as http:
            for element in files:
                r = await http.get(
                    f"{tab.url}/project/file/{element['chainlitKey']}", params={"session_id": tab.session_id}
                )
                r.raise_for_status()
                out.files[str(element["name"])] = r.content
    finally:
        await tab.close()
    out.short = [
        f"{r['reply']} {r['setup']}: {r['output_tokens']}" for r in out.rows() if int(r["output_tokens"]) < tokens
    ]
    return out


def run(url: str, messages: int, tokens: int) -> ChatLatency:
    return asyncio.run(chat_latency(url, messages, tokens))
