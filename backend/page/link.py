"""The chat page's one connection to the engine: where it is, how long to wait, its context window.

``app.py`` holds the Chainlit handlers and nothing else; everything here is plain asyncio and
httpx, so it can be read and tested without a browser. One :class:`EngineLink` per app
process holds the HTTP clients; the engine's run directory (``engine.run_dir``) says where
the engine listens and how fast its first token was during warm-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from backend.engine_api import chat_errors, count_tokens, engine_url, models
from backend.errors import ChatError, EngineDown, EngineRefused, EngineTimeout
from backend.page.history import Fitted, Message, TemplateCost, fit
from backend.runtime.rundir import RunDir
from backend.runtime.status import EngineStatus, StatusReader, WarmupRecord
from config.sampling import Sampling
from config.settings import Settings

POLL_S = 0.5
"""How often a waiting chat looks at the status file."""
AFTER_STOP = {"exited": "is being restarted", "restarting": "is being restarted", "gave up": "is not restarted"}
SEEN_DOWN_S = 2.0
"""How long a reply the engine dropped waits for ``serve`` (which looks every second) to say which
engine stopped, so that the message can name it."""


@dataclass(frozen=True)
class Target:
    """One engine to talk to: URL, model name, key, and the status it was read from."""

    base_url: str
    model: str
    api_key: str | None
    status: EngineStatus | None

    @property
    def demo(self) -> bool:
        return bool(self.status and self.status.demo)

    @property
    def started_at(self) -> float | None:
        """Identifies one start of the engine: a restart may plan another context length."""
        return self.status.started_at if self.status else None


@dataclass(frozen=True)
class Timeouts:
    """Seconds: connecting, the first token after sending, and the gap between two tokens."""

    connect: float
    first_token: float
    between_tokens: float

    def for_httpx(self) -> httpx.Timeout:
        """The socket-level backstop; the first-token and gap deadlines are enforced per chunk."""
        slowest = max(self.first_token, self.between_tokens)
        return httpx.Timeout(connect=self.connect, read=slowest, write=slowest, pool=slowest)


@dataclass(frozen=True)
class EngineFacts:
    """What the page learns once per engine start: its context window and its chat template's cost."""

    window: int
    template: TemplateCost


SHAPES = ("medium", "long")
"""Warm-up's prompt shapes that ``prefill_s`` fits through (``backend.runtime.warmup``)."""


def prefill_s(warm: WarmupRecord | None, tokens: int) -> float:
    """Seconds to the first token that warm-up's own prompts predict for a prompt of ``tokens``
    longer than its longest (0 up to that): t = a·n + b·n² through its medium and long prompts
    (attention grows with the square of the length), never below the long prompt's rate. On this
    2-core machine a 50,000-token paste took minutes where a fixed 15 s said "overloaded or stuck"."""
    if warm is None:
        return 0.0
    points = [(warm.prompt_tokens.get(s, 0), warm.by_shape.get(s, {}).get("max_ttft_s", 0.0)) for s in SHAPES]
    (n1, t1), (n2, t2) = points
    if n2 <= 0 or t2 <= 0 or tokens <= n2:
        return 0.0
    linear = t2 * tokens / n2
    if not 0 < n1 < n2 or t1 <= 0:
        return linear
    b = (t2 / n2 - t1 / n1) / (n2 - n1)  # t/n = a + b·n through both points
    a = t1 / n1 - b * n1
    return max(linear, a * tokens + b * tokens**2) if a >= 0 and b > 0 else linear


class EngineLink:
    """Locating the engine, its clients, what it can hold, and plain requests to it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.run_dir = RunDir(settings.engine.run_dir)
        self._status = StatusReader(self.run_dir.path)
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._facts: dict[tuple[str, str, float | None], EngineFacts] = {}

    # -- status ----------------------------------------------------------------------------
    def status(self) -> EngineStatus | None:
        """The run's status; the file is parsed again only once ``serve`` has changed it."""
        return self._status.read()

    def locate(self, status: EngineStatus | None = None) -> Target:
        """The status file's engine, else ``engine.host:port`` serving ``model.served_name or id``."""
        status = status if status is not None else self.status()
        s = self.settings
        base, model = "", s.model.served_name or s.model.id
        if status is not None:
            base, model = status.base_url, status.served_name or model
        return Target(base or engine_url(s.engine.host, s.engine.port), model, s.engine.api_key, status)

    def timeouts(self, status: EngineStatus | None, prompt_tokens: int = 0) -> Timeouts:
        """First token: fixed if set, else warm-up's slowest first token x margin, at least the floor,
        and for a prompt longer than warm-up's longest, its expected prefill x margin (``prefill_s``)."""
        a = self.settings.app
        first = a.first_token_timeout_s
        if first is None:
            warm = (status.warmup if status else None) or self.run_dir.warmup()
            slowest = warm.max_ttft_s if warm is not None else 0.0
            longest = max(slowest, prefill_s(warm, prompt_tokens))
            first = max(a.first_token_floor_s, longest * a.first_token_margin)
        return Timeouts(connect=a.connect_timeout_s, first_token=first, between_tokens=a.token_timeout_s)

    async def wait_ready(
        self, on_progress: Callable[[EngineStatus], Awaitable[None]], bound_s: float | None = None
    ) -> Target:
        """The engine once its status says ready (or when there is no status file: an engine
        started elsewhere). Calls ``on_progress`` on each change while it starts; raises
        EngineDown when it has failed or stopped, EngineTimeout after ``bound_s``."""
        bound = bound_s if bound_s is not None else self.settings.engine.start_timeout_s
        deadline = time.monotonic() + bound
        seen: tuple[str, str, float] | None = None
        while True:
            status = self.status()
            if status is None or status.state == "ready":
                return self.locate(status)
            if status.state in ("failed", "stopped"):
                why = (status.error or status.detail or status.state).splitlines()[0].split("; last log lines")[0]
                state = "has failed" if status.state == "failed" else "is stopped"
                raise EngineDown(f"The engine {state}: {why.rstrip('.')}.")
            now = (status.state, status.detail, status.progress)
            if now != seen:
                seen = now
                await on_progress(status)
            if time.monotonic() > deadline:
                raise EngineTimeout(f"The engine was still {status.state} after {bound:.0f} s ({status.detail}).")
            await asyncio.sleep(POLL_S)

    async def what_stopped(self) -> str:
        """For a reply the engine dropped: which engine stopped and what happens now, once ``serve``
        has seen it (within :data:`SEEN_DOWN_S`); empty when it has not, or the run is over."""
        deadline = time.monotonic() + SEEN_DOWN_S
        while True:
            status = self.status()
            if status is None or status.state in ("failed", "stopped"):
                return ""
            down = [e for e in status.engines if e.state != "serving"]
            if down:
                said = [f"{e.name} stopped and {AFTER_STOP[e.state]}" for e in down]
                return f" ({'; '.join(said)}; the other engines answer new messages.)"
            if status.state != "ready":
                return f" (The engine stopped and is being restarted: {status.detail}.)"
            if time.monotonic() > deadline:
                return ""
            await asyncio.sleep(0.2)

    # -- clients ---------------------------------------------------------------------------
    def client(self, target: Target) -> httpx.AsyncClient:
        """One HTTP client per engine, without keep-alive unless ``app.keepalive``: a dead engine
        then shows on the next request, never as a stale pooled socket. It has no timeouts of its
        own: each request passes the ones it was given (``timeouts``), worked out once per request."""
        if target.base_url not in self._clients:
            limits = httpx.Limits(max_keepalive_connections=None if self.settings.app.keepalive else 0)
            self._clients[target.base_url] = httpx.AsyncClient(timeout=None, limits=limits)
        return self._clients[target.base_url]

    # -- what the engine can hold ------------------------------------------------------------
    async def count(self, target: Target, messages: list[Message]) -> int:
        """Prompt tokens of a conversation with the model's own tokenizer and chat template."""
        timeout = self.timeouts(target.status).for_httpx()
        with chat_errors(target.base_url):
            return await count_tokens(
                self.client(target), target.base_url, target.model, messages, target.api_key, timeout=timeout
            )

    async def prepare(self, target: Target) -> None:
        """Learn the engine's window and template cost before the first message (a chat start
        calls this); a failure here is left for the message itself to report."""
        with contextlib.suppress(ChatError):
            await self.facts(target)

    async def facts(self, target: Target) -> EngineFacts:
        """The engine's window and template cost, learned once per engine start (a restart may
        plan another context length)."""
        key = (target.base_url, target.model, target.started_at)
        if key not in self._facts:
            self._facts[key] = await self._learn(target)
        return self._facts[key]

    async def _learn(self, target: Target) -> EngineFacts:
        timeout = self.timeouts(target.status).for_httpx()
        with chat_errors(target.base_url):
            served = await models(self.client(target), target.base_url, target.api_key, timeout=timeout)
        found = [m.max_model_len for m in served if m.id == target.model]
        length = found[0] if found and found[0] else self._planned_len()
        if not length:
            raise EngineRefused(f"The engine does not list the model '{target.model}' or its context length.")
        template = await TemplateCost.measure(lambda msgs: self.count(target, msgs))
        return EngineFacts(window=int(length), template=template)

    async def window(self, target: Target) -> int:
        """Context length: the engine's ``max_model_len`` (``/v1/models``, else ``plan.json``),
        capped by ``workload.context`` when that is set."""
        length = (await self.facts(target)).window
        cap = self.settings.workload.context
        return min(length, cap) if cap else length

    def _planned_len(self) -> int | None:
        plan = self.run_dir.plan()
        return plan.max_model_len if plan is not None else None

    async def fit(self, target: Target, history: list[Message], text: str, sampling: Sampling) -> Fitted:
        """System prompt + as many recent turns as fit + the new message (see ``history.fit``)."""
        facts = await self.facts(target)
        cap = self.settings.workload.context
        return await fit(
            history,
            text,
            system_prompt=sampling.system_prompt,
            reply_tokens=sampling.max_tokens,
            window=min(facts.window, cap) if cap else facts.window,
            template=facts.template,
            count=lambda messages: self.count(target, messages),
        )
