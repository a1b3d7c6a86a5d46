"""``bench-startup``: what start-up costs, and what warm-up saves the first user.

With warm-up on and off in turn: start the engine (its own run dir and port), time launch to
ready, then send the first user request and a few more (distinct prompts) and record their
time to first token. Without warm-up the first user pays for what vLLM does on first use
(kernel compilation, allocator growth); with it, the first user sees the steady state.
Then, per request path (``engine_api.KINDS``: chat or completions, streamed or whole, sampled
or greedy), its first request against its steady state, back to back and after a short pause;
optionally again after the engine sat idle (rounds in the order given, repeats allowed:
``--idle 30,120,30,120``); and optionally the chat page, started as ``up`` starts it (its first
use paid before ``chat:``) several times over: each start's first new chat against later ones,
each after the same short pause.
Output: a table, ``startup.json`` and ``startup.png`` (``plots.plot_startup``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from backend.engine_api import KINDS, ChatResult, Kind, ask, models, request
from backend.errors import MeasureError
from backend.measure.startup.records import IdleRound, PathWarmth, StartupFailure, StartupRun
from backend.page_client import NO_VISIBLE_REPLY, PageSession
from backend.prompts import prompt_of
from backend.runtime.processes.process import free_port
from backend.runtime.serve import Server, logged_server
from backend.runtime.up import WATCH_S, ChatPage
from config.settings import Settings

USER_REQUESTS = 6
REPLY_TOKENS = 16
PATH_REQUESTS = 4
PAGE_CHATS = 6
PAGE_STARTS = 3
PAUSE_S = 1.5
PAUSED_REQUESTS = 3


async def path_warmth(
    base_url: str, model: str, api_key: str | None, pause_s: float = PAUSE_S
) -> dict[str, PathWarmth]:
    """Per request path: its first request against the median of the next few sent back to back
    (``steady``) and of a few each sent after ``pause_s`` idle (``paused``: what a chat user's
    messages meet; on one H200 host a request after even 1 s idle cost 1.1-1.3x the next ones
    with the GPU's clock at its maximum, so that is the host's own, not a cold path). Every
    path's first request goes out before any path's steady ones, so each first meets the engine
    as the others left it (after idling: only the first path meets the idle engine itself)."""
    timed: dict[str, list[float]] = {kind.name: [] for kind in KINDS}
    paused: dict[str, list[float]] = {kind.name: [] for kind in KINDS}
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0)) as client:
        # the client's own first use (its connection, its HTTP code's first run), not the engine's
        await models(client, base_url, api_key)
        for n in (1, PATH_REQUESTS - 1):
            for kind in KINDS:
                for _ in range(n):
                    timed[kind.name].append(await _path_ttft(client, base_url, model, kind, api_key))
        for kind in KINDS if pause_s > 0 else ():
            for _ in range(PAUSED_REQUESTS):
                await asyncio.sleep(pause_s)
                paused[kind.name].append(await _path_ttft(client, base_url, model, kind, api_key))
    out: dict[str, PathWarmth] = {}
    for name, ttfts in timed.items():
        steady = statistics.median(ttfts[1:])
        out[name] = PathWarmth(
            first_ttft_s=round(ttfts[0], 4),
            steady_ttft_s=round(steady, 4),
            first_over_steady=round(ttfts[0] / steady, 2) if steady else 0.0,
        )
        if paused[name]:
            after_pause = statistics.median(paused[name])
            out[name].paused_ttft_s = round(after_pause, 4)
            out[name].first_over_paused = round(ttfts[0] / after_pause, 2) if after_pause else 0.0
    return out


async def path_request(
    client: httpx.AsyncClient, base_url: str, model: str, kind: Kind, api_key: str | None = None
) -> ChatResult:
    """One measuring request of ``kind`` (a distinct 40-word prompt, a 16-token reply); raises if it fails."""
    res = await request(client, base_url, model, kind, prompt_of(40), max_tokens=REPLY_TOKENS, api_key=api_key)
    if not res.ok:
        raise MeasureError(f"{kind.name} request failed: {res.error}")
    return res


async def _path_ttft(client: httpx.AsyncClient, base_url: str, model: str, kind: Kind, api_key: str | None) -> float:
    return (await path_request(client, base_url, model, kind, api_key)).ttft_s or 0.0


def idle_round(server: Server, seconds: float) -> IdleRound:
    """Leave the engine alone for ``seconds`` (``serve``'s watch loop running), then every path's
    first request against its steady state; with the seconds actually idled and the machine's
    load (others share it)."""
    t0 = time.monotonic()
    while (left := seconds - (time.monotonic() - t0)) > 0:
        time.sleep(min(left, WATCH_S))
        if not server.check():
            raise MeasureError(f"the engine stopped while idle: {server.status.error}")
    slept = time.monotonic() - t0
    load = os.getloadavg()[0]
    assert server.planned is not None
    paths = asyncio.run(path_warmth(server.base_url, server.planned.plan.served_name, server.settings.engine.api_key))
    return IdleRound(
        idle_s=seconds, slept_s=round(slept, 1), load1=round(load, 2), at=round(time.time(), 1), paths=paths
    )


@dataclass(frozen=True)
class PageChat:
    """One new chat through the page's socket: the client's time to first text (None for a reply
    with no visible text, which a model may give) and the page's footer
    (its own TTFT and the engine's share, ms): which side a slow first chat's time went to."""

    ttft_s: float | None
    footer_ms: tuple[int, int] | None


async def page_first_chats(page_url: str, n: int = PAGE_CHATS, pause_s: float = PAUSE_S) -> list[PageChat]:
    """``n`` new chats through the page's socket, one after another, page defaults, each after
    ``pause_s`` idle: the first user arrives some time after ``chat:`` and later ones some time
    after each other, and any pause costs the next request (``path_warmth``), so the first chat
    is compared with later ones on equal terms and what is left is the cost of being first."""
    out: list[PageChat] = []
    await (await PageSession(page_url).connect()).close()  # the client's own first socket, not the page's
    for _ in range(n):
        await asyncio.sleep(pause_s)
        tab = await PageSession(page_url).connect()
        try:
            res = await tab.ask(prompt_of(24))
        finally:
            await tab.close()
        if res.error and not res.error.startswith(NO_VISIBLE_REPLY):
            raise MeasureError(f"page chat failed: {res.error}")
        out.append(PageChat(res.ttft_s, tab.shown_ttft_ms))
    return out


async def _user_requests(base_url: str, model: str, api_key: str | None, n: int) -> list[float]:
    """TTFT of ``n`` sequential user-like requests (distinct prompts, so no prefix-cache hits)."""
    out: list[float] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0)) as client:
        for _ in range(n):
            res = await ask(client, base_url, model, prompt_of(40), max_tokens=REPLY_TOKENS, api_key=api_key)
            if not res.ok:
                raise MeasureError(f"request failed: {res.error}")
            out.append(res.ttft_s or 0.0)
    return out


def measure_start(
    settings: Settings, *, warmup: bool, run_dir: Path, idle_s: Sequence[float] = (), page: bool = False
) -> StartupRun | StartupFailure:
    """One start with warm-up on or off: launch to ready, the first users' TTFTs, every path's
    warmth, idle rounds and (``page``) the page's first chats."""
    s = settings.model_copy(deep=True)
    s.engine.warmup = warmup
    s.engine.port = free_port()
    s.engine.run_dir = run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    with logged_server(s, run_dir / "serve.log") as server:
        t0 = time.monotonic()
        if not server.start():
            return StartupFailure(warmup=warmup, error=server.status.error)
        ready_s = time.monotonic() - t0
        assert server.planned is not None
        model, key = server.planned.plan.served_name, s.engine.api_key
        ttfts = asyncio.run(_user_requests(server.base_url, model, key, USER_REQUESTS))
        paths = asyncio.run(path_warmth(server.base_url, model, key))
        idle: list[IdleRound] = []
        with open(run_dir / "idle.jsonl", "a") as log:  # each round as it ends: a long run keeps what it measured
            for seconds in idle_s:
                idle.append(idle_round(server, seconds))
                log.write(idle[-1].model_dump_json() + "\n")
                log.flush()
        page_chats = _page_chats(s, run_dir, server.planned.plan.page_processes) if page else []
        return StartupRun(
            paths=paths,
            after_idle_s=idle,
            page_chat_ttfts_s=[[c.ttft_s and round(c.ttft_s, 4) for c in chats] for chats in page_chats],
            page_chat_footers_ms=[[c.footer_ms for c in chats] for chats in page_chats],
            warmup=warmup,
            ready_s=round(ready_s, 1),
            startup=server.status.startup,
            plan=server.planned.plan.summary(),
            first_user_ttft_s=round(ttfts[0], 4),
            steady_ttft_s=round(statistics.median(ttfts[1:]), 4),
            user_ttfts_s=[round(t, 4) for t in ttfts],
            warmup_record=server.status.warmup,
        )


def _page_chats(settings: Settings, run_dir: Path, workers: int = 1, starts: int = PAGE_STARTS) -> list[list[PageChat]]:
    """Start the page as ``up`` does (``workers`` processes, serving, then its first use paid)
    ``starts`` times; each start's new chats (the first of each list is the first user's)."""
    out = []
    for _ in range(starts):
        s = settings.model_copy(deep=True)
        s.app.port = free_port()
        s.app.host = "127.0.0.1"
        page = ChatPage.for_settings(s, workers=workers)
        page.start()
        try:
            why = page.wait_serving() or page.pay_first_use()
            if why:
                raise MeasureError(why)
            out.append(asyncio.run(page_first_chats(page.url)))
        finally:
            page.stop()
    return out
