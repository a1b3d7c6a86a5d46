"""``bench-startup``: what start-up costs, and what warm-up saves the first user.

With warm-up on and off in turn: start the engine (its own run dir and port), time launch to
ready, then send the first user request and a few more (distinct prompts) and record their
time to first token. Without warm-up the first user pays for what vLLM does on first use
(kernel compilation, allocator growth); with it, the first user sees the steady state.
Then, per request path (``engine_api.KINDS``: chat or completions, streamed or whole, sampled
or greedy), its first request against its steady state; optionally again after the engine sat
idle; and optionally the chat page: its first new chat after it answers against later ones.
Output: a table, ``startup.json`` and ``startup.png`` (``plots.plot_startup``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from backend.engine_api import KINDS, ask, request
from backend.measure.page_client import PageSession
from backend.measure.prompts import prompt_of
from backend.runtime.process import free_port
from backend.runtime.serve import logged_server
from backend.runtime.up import ChatPage
from config.settings import Settings

USER_REQUESTS = 6
REPLY_TOKENS = 16
PATH_REQUESTS = 4
PAGE_CHATS = 6


async def path_warmth(base_url: str, model: str, api_key: str | None) -> dict[str, dict[str, float]]:
    """Per request path: the first request's TTFT against the median of the next few."""
    out: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0)) as client:
        for kind in KINDS:
            ttfts = []
            for _ in range(PATH_REQUESTS):
                res = await request(
                    client, base_url, model, kind, prompt_of(40), max_tokens=REPLY_TOKENS, api_key=api_key
                )
                if not res.ok:
                    raise RuntimeError(f"{kind.name} request failed: {res.error}")
                ttfts.append(res.ttft_s or 0.0)
            steady = statistics.median(ttfts[1:])
            out[kind.name] = {
                "first_ttft_s": round(ttfts[0], 4),
                "steady_ttft_s": round(steady, 4),
                "first_over_steady": round(ttfts[0] / steady, 2) if steady else 0.0,
            }
    return out


async def page_first_chats(page_url: str, n: int = PAGE_CHATS) -> list[float]:
    """TTFT of ``n`` new chats through the page's socket, one after another, page defaults."""
    out = []
    for _ in range(n):
        tab = await PageSession(page_url).connect()
        try:
            res = await tab.ask(prompt_of(24))
        finally:
            await tab.close()
        if res.error:
            raise RuntimeError(f"page chat failed: {res.error}")
        out.append(res.ttft_s or 0.0)
    return out


async def _user_requests(base_url: str, model: str, api_key: str | None, n: int) -> list[float]:
    """TTFT of ``n`` sequential user-like requests (distinct prompts, so no prefix-cache hits)."""
    out: list[float] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0)) as client:
        for _ in range(n):
            res = await ask(client, base_url, model, prompt_of(40), max_tokens=REPLY_TOKENS, api_key=api_key)
            if not res.ok:
                raise RuntimeError(f"request failed: {res.error}")
            out.append(res.ttft_s or 0.0)
    return out


def measure_start(
    settings: Settings, *, warmup: bool, run_dir: Path, idle_s: Sequence[float] = (), page: bool = False
) -> dict[str, Any]:
    s = settings.model_copy(deep=True)
    s.engine.warmup = warmup
    s.engine.port = free_port()
    s.engine.run_dir = run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    with logged_server(s, run_dir / "serve.log") as server:
        t0 = time.monotonic()
        if not server.start():
            return {"warmup": warmup, "ok": False, "error": server.status.error}
        ready_s = time.monotonic() - t0
        assert server.planned is not None
        model, key = server.planned.plan.served_name, s.engine.api_key
        ttfts = asyncio.run(_user_requests(server.base_url, model, key, USER_REQUESTS))
        paths = asyncio.run(path_warmth(server.base_url, model, key))
        idle: dict[str, dict[str, dict[str, float]]] = {}
        for seconds in idle_s:
            time.sleep(seconds)
            idle[f"{seconds:g}"] = asyncio.run(path_warmth(server.base_url, model, key))
        page_ttfts: list[float] = []
        if page:
            page_ttfts = _page_chats(s, run_dir)
        return {
            "paths": paths,
            "after_idle_s": idle,
            "page_chat_ttfts_s": [round(x, 4) for x in page_ttfts],
            "warmup": warmup,
            "ok": True,
            "ready_s": round(ready_s, 1),
            "startup": server.status.startup,
            "plan": server.planned.plan.summary(),
            "first_user_ttft_s": round(ttfts[0], 4),
            "steady_ttft_s": round(statistics.median(ttfts[1:]), 4),
            "user_ttfts_s": [round(t, 4) for t in ttfts],
            "warmup_record": server.status.warmup.model_dump() if server.status.warmup else None,
        }


def _page_chats(settings: Settings, run_dir: Path) -> list[float]:
    """Start the page as ``up`` does (its first use paid before it counts as serving), then time new chats."""
    s = settings.model_copy(deep=True)
    s.app.port = free_port()
    s.app.host = "127.0.0.1"
    page = ChatPage.for_settings(s)
    page.start()
    try:
        why = page.wait_serving()
        if why:
            raise RuntimeError(why)
        return asyncio.run(page_first_chats(page.url))
    finally:
        page.stop()
