"""The chat page's side of the engine: where it is, how long to wait, what fits, one streamed reply.

``app.py`` holds the Chainlit handlers and nothing else; everything here is plain asyncio and
httpx, so it can be read and tested without a browser. One :class:`EngineLink` per app
process holds the clients; the engine's status file (``engine.run_dir``) says where the
engine listens and how fast its first token was during warm-up.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from backend.engine_api import ChatResult, headers, root_url
from backend.errors import EngineDown, EngineRefused, EngineTimeout, TooLong
from backend.runtime.status import EngineStatus, read_status, read_warmup
from config.settings import Settings

Message = dict[str, str]
POLL_S = 0.5
"""How often a waiting chat looks at the status file."""
PAGE_MARKER = "<!-- engine-plan -->"
"""Where the live plan goes in the tracked ``chainlit.md`` template."""


# -- where the engine is --------------------------------------------------------------------
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


@dataclass
class Fitted:
    """The request to send: system prompt, the turns that fit, the new message."""

    messages: list[Message]
    prompt_tokens: int
    kept_turns: int
    dropped_turns: int
    window: int


@dataclass
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int
    system_prompt: str

    @classmethod
    def from_values(cls, values: dict[str, Any], settings: Settings) -> Sampling:
        """The session's chat settings, falling back to ``settings.app``."""
        a = settings.app
        return cls(
            temperature=float(values.get("temperature", a.temperature)),
            top_p=float(values.get("top_p", a.top_p)),
            max_tokens=max(1, int(values.get("max_tokens", a.max_tokens))),
            system_prompt=str(values.get("system_prompt", a.system_prompt) or ""),
        )


def progress_line(status: EngineStatus) -> str:
    return f"Engine **{status.state}**: {status.detail or '…'} — {status.progress:.0%}"


def footer(result: ChatResult, *, stopped: bool = False) -> str:
    """``TTFT 123 ms · 48 tokens · 35.2 tok/s``, measured as ``backend.engine_api`` measures."""
    ttft = f"TTFT {result.ttft_s * 1000:.0f} ms" if result.ttft_s is not None else "no first token"
    line = f"{ttft} · {result.tokens} tokens · {result.tokens_per_s:.1f} tok/s"
    return f"stopped · {line}" if stopped else line


def with_footer(text: str, line: str, note: str = "") -> str:
    """The reply, then the footer in small print; an unclosed code fence is closed first."""
    if text.count("```") % 2:
        text += "\n```"
    extra = f"  \n*{note}*" if note else ""
    return f"{text}\n\n---\n*{line}*{extra}"


class EngineLink:
    """The app's one connection to the engine: locating it, clients, context window, streaming."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.run_dir = settings.engine.run_dir
        self._clients: dict[tuple[str, str | None, Timeouts], tuple[openai.AsyncOpenAI, httpx.AsyncClient]] = {}
        self._windows: dict[tuple[str, str, float | None], int] = {}

    # -- status ----------------------------------------------------------------------------
    def status(self) -> EngineStatus | None:
        return read_status(self.run_dir)

    def locate(self, status: EngineStatus | None = None) -> Target:
        """The status file's engine, else ``engine.host:port`` serving ``model.served_name or id``."""
        status = status if status is not None else self.status()
        s = self.settings
        base, model = "", s.model.served_name or s.model.id
        if status is not None:
            base, model = status.base_url, status.served_name or model
        if not base:
            host = "127.0.0.1" if s.engine.host in ("0.0.0.0", "") else s.engine.host
            base = f"http://{host}:{s.engine.port}/v1"
        return Target(base, model, s.engine.api_key, status)

    def timeouts(self, status: EngineStatus | None) -> Timeouts:
        """First token: fixed if set, else warm-up's slowest first token x margin, at least the floor."""
        a = self.settings.app
        first = a.first_token_timeout_s
        if first is None:
            warm = (status.warmup if status else None) or read_warmup(self.run_dir) or {}
            slowest = float(warm.get("max_ttft_s") or 0.0)
            first = max(a.first_token_floor_s, slowest * a.first_token_margin)
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

    # -- clients ---------------------------------------------------------------------------
    def client(self, target: Target) -> tuple[openai.AsyncOpenAI, httpx.AsyncClient, Timeouts]:
        """One OpenAI client per engine and timeouts, over an httpx client without keep-alive
        unless ``app.keepalive``: a dead engine then shows on the next request, never as a
        stale pooled socket."""
        timeouts = self.timeouts(target.status)
        key = (target.base_url, target.api_key, timeouts)
        if key not in self._clients:
            limits = httpx.Limits(max_keepalive_connections=None if self.settings.app.keepalive else 0)
            http = httpx.AsyncClient(timeout=timeouts.for_httpx(), limits=limits)
            ai = openai.AsyncOpenAI(
                base_url=target.base_url,
                api_key=target.api_key or "EMPTY",
                http_client=http,
                timeout=timeouts.for_httpx(),
                max_retries=0,
            )
            self._clients[key] = (ai, http)
        ai, http = self._clients[key]
        return ai, http, timeouts

    async def _call(self, target: Target, method: str, url: str, **kw: Any) -> httpx.Response:
        _, http, _ = self.client(target)
        try:
            r = await http.request(method, url, headers=headers(target.api_key), **kw)
        except httpx.ConnectError:
            raise EngineDown(f"Cannot reach the engine at {target.base_url} (is it running?).") from None
        except httpx.TimeoutException:
            raise EngineTimeout(f"The engine at {target.base_url} did not answer in time.") from None
        except httpx.HTTPError as err:
            why = type(err).__name__
            raise EngineDown(f"The engine at {target.base_url} dropped the connection ({why}); did it stop?") from None
        if r.status_code != 200:
            raise EngineRefused(f"The engine refused {url.rsplit('/', 1)[-1]}: HTTP {r.status_code} {r.text[:200]}")
        return r

    # -- context ---------------------------------------------------------------------------
    async def window(self, target: Target) -> int:
        """Context length: the engine's ``max_model_len`` (``/v1/models``, else ``plan.json``),
        capped by ``workload.context`` when that is set."""
        key = (target.base_url, target.model, target.status.started_at if target.status else None)
        if key not in self._windows:  # per engine start: a restart may plan another length
            r = await self._call(target, "GET", f"{target.base_url}/models")
            found = [m.get("max_model_len") for m in r.json().get("data", []) if m.get("id") == target.model]
            length = found[0] if found and found[0] else self._planned_len()
            if not length:
                raise EngineRefused(f"The engine does not list the model '{target.model}' or its context length.")
            self._windows[key] = int(length)
        cap = self.settings.workload.context
        return min(self._windows[key], cap) if cap else self._windows[key]

    def _planned_len(self) -> int | None:
        try:
            return int(json.loads((Path(self.run_dir) / "plan.json").read_text())["max_model_len"])
        except (OSError, ValueError, KeyError):
            return None

    async def count(self, target: Target, messages: list[Message]) -> int:
        """Prompt tokens of a conversation with the model's own tokenizer and chat template."""
        r = await self._call(
            target, "POST", f"{root_url(target.base_url)}/tokenize", json={"model": target.model, "messages": messages}
        )
        return int(r.json()["count"])

    async def fit(self, target: Target, history: list[Message], text: str, sampling: Sampling) -> Fitted:
        """System prompt + as many recent turns as fit + the new message, leaving
        ``max_tokens`` for the reply. Oldest turns go first (found by bisection, a handful of
        /tokenize calls). Raises TooLong when the new message cannot fit even alone."""
        window = await self.window(target)
        limit = window - sampling.max_tokens
        system = [{"role": "system", "content": sampling.system_prompt}] if sampling.system_prompt else []
        new = [{"role": "user", "content": text}]
        turns = [history[i : i + 2] for i in range(0, len(history), 2)]

        def build(drop: int) -> list[Message]:
            return system + [m for turn in turns[drop:] for m in turn] + new

        alone = await self.count(target, system + new)
        if alone > limit:
            raise TooLong(alone, max(limit, 0), window, sampling.max_tokens, len(turns))
        tokens = await self.count(target, build(0)) if turns else alone
        if tokens <= limit:
            return Fitted(build(0), tokens, len(turns), 0, window)
        fits, fails = len(turns), 0  # dropping every turn fits, dropping none does not
        tokens = alone
        while fits - fails > 1:
            mid = (fits + fails) // 2
            n = await self.count(target, build(mid))
            if n <= limit:
                fits, tokens = mid, n
            else:
                fails = mid
        return Fitted(build(fits), tokens, len(turns) - fits, fits, window)

    # -- one reply -------------------------------------------------------------------------
    async def stream(
        self,
        target: Target,
        messages: list[Message],
        sampling: Sampling,
        on_token: Callable[[str], Awaitable[None]],
        result: ChatResult | None = None,
    ) -> ChatResult:
        """Stream one reply into ``on_token``. Times from sending to the first content delta;
        tokens from the stream's usage. The first delta goes out at once, later ones joined at
        most every ``app.stream_interval_ms`` (the page keeps up with any engine; timing stays
        per delta). The response is always closed on the way out, also when the task is
        cancelled (Stop), so vLLM sees the disconnect and aborts the request."""
        ai, _, timeouts = self.client(target)
        res = result if result is not None else ChatResult()
        t0 = time.perf_counter()
        deltas = 0
        interval = self.settings.app.stream_interval_ms / 1000
        pending: list[str] = []
        flushed_at = -interval

        async def flush(now: float) -> None:
            nonlocal flushed_at
            if pending:
                text = "".join(pending)
                pending.clear()
                flushed_at = now
                await on_token(text)

        def left() -> float:
            if res.ttft_s is None:
                return timeouts.first_token - (time.perf_counter() - t0)
            return timeouts.between_tokens

        try:
            async with asyncio.timeout(left()):
                stream = await ai.chat.completions.create(
                    model=target.model,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=sampling.max_tokens,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            async with stream:
                while True:
                    try:
                        async with asyncio.timeout(max(left(), 0.001)):
                            chunk = await anext(stream)
                    except StopAsyncIteration:
                        break
                    if chunk.usage:
                        res.tokens = chunk.usage.completion_tokens
                    for choice in chunk.choices:
                        piece = choice.delta.content if choice.delta else None
                        if piece:
                            now = time.perf_counter() - t0
                            res.ttft_s = now if res.ttft_s is None else res.ttft_s
                            res.token_times.append(now)
                            res.text += piece
                            deltas += 1
                            pending.append(piece)
                            if now - flushed_at >= interval:
                                await flush(now)
                        if choice.finish_reason:
                            res.finish_reason = choice.finish_reason
                await flush(time.perf_counter() - t0)
        except TimeoutError:
            if res.ttft_s is None:
                raise EngineTimeout(
                    f"No first token within {timeouts.first_token:.0f} s (the engine is overloaded or stuck)."
                ) from None
            raise EngineTimeout(f"The engine went silent for {timeouts.between_tokens:.0f} s mid-reply.") from None
        except (openai.APITimeoutError, httpx.TimeoutException):
            raise EngineTimeout(f"The engine at {target.base_url} did not answer in time.") from None
        except (openai.APIConnectionError, httpx.HTTPError):
            if res.ttft_s is None:
                raise EngineDown(f"Cannot reach the engine at {target.base_url} (is it running?).") from None
            raise EngineDown("The engine dropped the connection mid-reply (did it stop?).") from None
        except openai.APIStatusError as err:
            raise EngineRefused(f"The engine refused the request: HTTP {err.status_code} {err.message[:300]}") from None
        finally:
            res.total_s = time.perf_counter() - t0
            res.tokens = res.tokens or deltas
        return res


# -- the plan, for chainlit.md and the welcome message -----------------------------------------
def plan_markdown(status: EngineStatus | None, run_dir: Path) -> str:
    """What runs and why, from the status file and ``plan.json``: the page's live section."""
    if status is None:
        return "_No engine has been started from this run directory yet._"
    try:
        plan: dict[str, Any] = json.loads((Path(run_dir) / "plan.json").read_text())
    except (OSError, ValueError):
        plan = {}
    detail = f" — {status.detail} ({status.progress:.0%})" if status.state != "ready" and status.detail else ""
    lines = [f"**Engine:** {status.state}{detail}  "]
    if status.plan_summary:
        lines.append(f"**Plan:** {status.plan_summary}  ")
    if status.hardware:
        lines.append(f"**Hardware:** {status.hardware}  ")
    if status.model:
        lines.append(f"**Model:** {status.model}, served as `{status.served_name}`  ")
    lines += [f"> {note}  " for note in status.notes]
    w = status.warmup
    if w and not w.get("disabled") and "first_ttft_s" in w:
        lines.append(
            f"**Warm-up:** first token {w['first_ttft_s'] * 1000:.0f} ms on the first request, "
            f"{w['steady_ttft_s'] * 1000:.0f} ms once warm  "
        )
    if status.demo:
        lines += ["", "> ⚠️ **Demo model: random weights.** Answers are noise; serve real weights with `--model`."]
    if status.plan_reasons:
        lines += ["", "| Setting | Value | Why |", "|---|---|---|"]
        for key, why in status.plan_reasons.items():
            value = plan.get(key, "")
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items())
            lines.append(f"| `{key}` | {str(value).replace('|', '/')} | {why.replace('|', '/')} |")
    lines += ["", f"_Updated {time.strftime('%H:%M:%S', time.localtime(status.updated_at))}._"]
    for note in status.notes:
        lines.insert(1, f"> {note}  ")
    return "\n".join(lines)


def render_page(template: str, status: EngineStatus | None, run_dir: Path) -> str:
    """The tracked ``chainlit.md`` with its plan marker replaced by :func:`plan_markdown`."""
    section = plan_markdown(status, run_dir)
    if PAGE_MARKER in template:
        return template.replace(PAGE_MARKER, section)
    return f"{template.rstrip()}\n\n{section}\n"


def write_if_changed(path: Path, text: str) -> bool:
    """Atomic replace, only when the text differs (readers see whole files)."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")  # pages sharing a run dir write in turn
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True
