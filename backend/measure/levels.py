"""One load level, straight to vLLM or through the chat page.

Each level is closed-loop: ``concurrency`` workers each send the next request as soon as their
last one ends, until the level's request count or its time cap is reached. Straight to vLLM
(the project's streaming ``ask``, ``ignore_eos`` so every reply has the same length), spread
over client processes on large machines (``loadgen``); through the page, each request is a
fresh browser tab. Prompts are distinct (``prompt_of``), so the prefix cache never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from backend.engine_api import ChatResult, ask
from backend.errors import UsageError
from backend.measure.loadgen import JobFn, Ready, Span, client_processes, fan_out, merge, split
from backend.measure.stats import Level, summarize
from backend.prompts import prompt_of

LEVEL_TIME_CAP_S = 120.0
"""No new request starts after this many seconds in one level."""
DRAIN_S = 60.0
"""Requests still running this long after the cap are cut off (counted, not errors)."""


@dataclass(frozen=True)
class Target:
    """The engine measured: its OpenAI base URL, the served model name and the API key."""

    base_url: str
    model: str
    api_key: str | None = None


@dataclass(frozen=True)
class Load:
    """How every request of a level is shaped and how long a level may take.

    Request i gets a fresh prompt of ``prompt_words[i % len]`` words and ``max_tokens`` reply
    tokens. ``keepalive`` (direct path) False: a new connection per request, as the chat page
    does by default; True: pooled connections, the pool sized so it never queues a request.
    ``processes``: client processes sharing a direct level (None: ``loadgen.client_processes``).
    """

    max_tokens: int
    prompt_words: tuple[int, ...]
    keepalive: bool = True
    time_cap_s: float = LEVEL_TIME_CAP_S
    drain_s: float = DRAIN_S
    processes: int | None = None

    def __post_init__(self) -> None:
        words = (self.prompt_words,) if isinstance(self.prompt_words, int) else tuple(self.prompt_words)
        if not words or min(words) < 1:
            raise UsageError("prompt_words: one or more word counts, each at least 1")
        object.__setattr__(self, "prompt_words", words)

    def prompt(self, i: int) -> str:
        return prompt_of(self.prompt_words[i % len(self.prompt_words)])


async def closed_loop(
    concurrency: int,
    n_requests: int,
    one: Callable[[int, int], Awaitable[ChatResult]],
    time_cap_s: float,
    drain_s: float,
) -> tuple[list[ChatResult], float, int]:
    """``concurrency`` workers take request numbers until ``n_requests`` or the cap.

    ``one(worker, i)`` returns a ChatResult. Returns (results, wall seconds, cut-off count).
    """
    results: list[ChatResult] = []
    next_i = 0
    t0 = time.perf_counter()
    deadline = t0 + time_cap_s
    last_end = t0

    async def worker(w: int) -> None:
        nonlocal next_i, last_end
        while next_i < n_requests and time.perf_counter() < deadline:
            i = next_i
            next_i += 1
            res = await one(w, i)
            results.append(res)
            last_end = time.perf_counter()

    tasks = [asyncio.create_task(worker(w)) for w in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=time_cap_s + drain_s)
    wall = (time.perf_counter() if pending else last_end) - t0
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and (err := task.exception()) is not None:
            raise err
    return results, wall, len(pending)


async def _direct_span(
    target: Target, load: Load, concurrency: int, n_requests: int, ready: Ready, part: int = 0
) -> Span:
    """``part``: this process's index in the level (unused here: each process is its own users)."""
    limits = httpx.Limits(
        max_connections=max(100, concurrency),
        max_keepalive_connections=max(20, concurrency) if load.keepalive else 0,
    )
    read = load.time_cap_s + load.drain_s
    timeout = httpx.Timeout(connect=10.0, read=read, write=30.0, pool=read)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        users = uuid.uuid4().hex[:8]  # each worker is one simulated user: its own router session

        async def one(worker: int, i: int) -> ChatResult:
            return await ask(
                client,
                target.base_url,
                target.model,
                load.prompt(i),
                max_tokens=load.max_tokens,
                api_key=target.api_key,
                session=f"bench-{users}-{worker}",
            )

        await asyncio.to_thread(ready)
        return await _timed(closed_loop(concurrency, n_requests, one, load.time_cap_s, load.drain_s))


async def _timed(loop: Awaitable[tuple[list[ChatResult], float, int]]) -> Span:
    """A closed loop's results as a Span, with the CPU time this process spent on it."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    results, wall, cut = await loop
    return Span(results, t0, t0 + wall, cut, time.process_time() - cpu0)


def direct_span(job: dict[str, Any], ready: Ready) -> Span:
    """One client process's share of a level: ``{target, load, concurrency, n_requests}``
    (module level: a spawned process imports it)."""
    return asyncio.run(_direct_span(**job, ready=ready))


async def measure_level(target: Target, concurrency: int, n_requests: int, load: Load) -> Level:
    """One level straight to vLLM: ``n_requests`` streamed chats, ``concurrency`` at a time,
    each with exactly ``load.max_tokens`` reply tokens (``ignore_eos``)."""
    return await _spread(direct_span, {"target": target}, concurrency, n_requests, load)


async def _spread(fn: JobFn, job: dict[str, Any], concurrency: int, n_requests: int, load: Load) -> Level:
    """One level as ``fn`` measures it, in one client process or shared by several (``loadgen``)."""
    if concurrency < 1 or n_requests < 1:
        raise UsageError("concurrency and n_requests must be at least 1")
    procs = min(load.processes or client_processes(concurrency), concurrency, n_requests)
    jobs = [
        {**job, "load": load, "concurrency": c, "n_requests": n, "part": k}
        for k, (c, n) in enumerate(zip(split(concurrency, procs), split(n_requests, procs), strict=True))
    ]
    if procs <= 1:
        span = await asyncio.to_thread(fn, jobs[0], lambda: None)
    else:
        span = merge(await asyncio.to_thread(fan_out, fn, jobs, load.time_cap_s + load.drain_s))
    level = summarize(
        span.results, concurrency=concurrency, planned=n_requests, wall_s=span.end - span.start, cut_off=span.cut_off
    )
    level.short_replies = short_replies(span.results, load.max_tokens)
    level.client_processes = procs
    level.client_busy = round(span.busy, 3)
    return level


def short_replies(results: Sequence[ChatResult], max_tokens: int) -> int:
    return sum(1 for r in results if r.ok and r.tokens < max_tokens)


async def measure_page_level(
    page_url: str, concurrency: int, n_requests: int, load: Load, *, cookie: str | None = None
) -> Level:
    """One level through the chat page: ``concurrency`` browser tabs at a time, the same prompt
    shapes, spread over client processes as the direct path is.

    Every request is the first message of a new chat (its own tab), so it carries no history
    and its prompt matches the direct path's. All of a level's tabs are opened (and their chat
    settings set: ``max_tokens``, temperature 0) before the clock starts, as the direct path's
    connections are; a process's tabs share one HTTP session. The page cannot ask for
    ``ignore_eos``, so replies may end early (``short_replies``).
    """
    return await _spread(page_span, {"page_url": page_url, "cookie": cookie}, concurrency, n_requests, load)


TAB_OPENS_AT_ONCE = 16
"""Tabs a client process opens at the same time before a page level starts."""
SOURCES_PER_PROCESS = 8
"""Client addresses each client process's tabs come from (127.0.0.x, for a page on this machine)."""


def page_span(job: dict[str, Any], ready: Ready) -> Span:
    """One client process's share of a page level: ``{page_url, cookie, load, concurrency,
    n_requests, part}`` (module level: a spawned process imports it)."""
    return asyncio.run(_page_span(**job, ready=ready))


async def _page_span(
    page_url: str, cookie: str | None, load: Load, concurrency: int, n_requests: int, ready: Ready, part: int = 0
) -> Span:
    from backend.page_client import PageError, PageSession, loopback_sources, session_from

    # Each open tab holds one of the session's connections: no pool limit (aiohttp's 100 would
    # leave the 101st tab waiting for a connection that never frees). Tabs come from several
    # client addresses (a page of several processes places each address on one of them).
    sources = loopback_sources(page_url, SOURCES_PER_PROCESS, first=2 + part * SOURCES_PER_PROCESS)
    async with contextlib.AsyncExitStack() as stack:
        https = [await stack.enter_async_context(session_from(s, limit=0)) for s in sources]
        gate = asyncio.Semaphore(TAB_OPENS_AT_ONCE)

        async def open_tab(i: int) -> PageSession | PageError:
            async with gate:
                try:
                    tab = PageSession(page_url, cookie=cookie, http_session=https[i % len(https)])
                    await tab.connect()
                    await tab.set_settings(max_tokens=load.max_tokens, temperature=0.0)
                except PageError as err:
                    return err
                return tab

        tabs = await asyncio.gather(*(open_tab(i) for i in range(n_requests)))
        try:

            async def one(_worker: int, i: int) -> ChatResult:
                tab = tabs[i]
                if isinstance(tab, PageError):
                    return ChatResult(error=str(tab))
                try:
                    return await tab.ask(load.prompt(i), timeout=load.time_cap_s + load.drain_s)
                finally:
                    await tab.close()

            await asyncio.to_thread(ready)
            return await _timed(closed_loop(concurrency, n_requests, one, load.time_cap_s, load.drain_s))
        finally:
            await asyncio.gather(*(t.close() for t in tabs if isinstance(t, PageSession)))
