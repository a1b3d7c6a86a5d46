"""What every part of the project shares about the engine's OpenAI-compatible API.

Its URL from the bind host, auth headers, one timed streaming parser (used by warm-up, bench,
tests and the chat page, so every latency figure is measured the same way: from sending the
request to the first content delta), the served models and their context (``/v1/models``), token
counts with the model's tokenizer (``/tokenize``) and vLLM's Prometheus ``/metrics``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from backend.errors import EngineDown, EngineRefused, EngineTimeout
from config.sampling import Sampling
from config.settings import AppSettings

WILDCARD_HOSTS = ("", "0.0.0.0", "::")
"""Bind addresses that mean "every interface": a client on this machine uses loopback."""


def local_host(bind_host: str) -> str:
    """Where a client on this machine reaches a server bound to ``bind_host``."""
    return "127.0.0.1" if bind_host in WILDCARD_HOSTS else bind_host


def engine_url(bind_host: str, port: int) -> str:
    """The engine's OpenAI base URL (``.../v1``) for a server bound to ``bind_host:port``."""
    return f"http://{local_host(bind_host)}:{port}/v1"


def root_url(base_url: str) -> str:
    """``http://h:p/v1`` -> ``http://h:p``: /metrics, /health and /tokenize live at the root."""
    return base_url.rstrip("/").removesuffix("/v1")


SESSION_HEADER = "x-session-id"
"""The router keeps every request carrying the same value on one engine (its prefix cache)."""


@contextmanager
def chat_errors(base_url: str, replying: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """httpx's errors as sentences a person can act on, one mapping for plain requests and streamed
    replies: an engine (or router) that cannot be reached is not one that dropped the connection.
    ``replying``: whether the reply had begun when the connection went."""
    try:
        yield
    except httpx.ConnectError:
        raise EngineDown(f"Cannot reach the engine at {base_url} (is it running?).") from None
    except httpx.TimeoutException:
        raise EngineTimeout(f"The engine at {base_url} did not answer in time.") from None
    except httpx.HTTPStatusError as err:  # raise_for_status on a plain (not streamed) request
        code, what = err.response.status_code, err.request.url.path.rsplit("/", 1)[-1]
        raise EngineRefused(f"The engine refused {what}: HTTP {code} {err.response.text[:200]}", code) from None
    except httpx.HTTPError as err:
        when = "mid-reply" if replying() else "before the reply began"
        raise EngineDown(
            f"The engine at {base_url} dropped the connection {when} ({in_words(err)}); did it stop?"
        ) from None


CONNECTION_FAULTS: tuple[tuple[type[httpx.HTTPError], str], ...] = (
    (httpx.RemoteProtocolError, "it closed the connection before its answer was complete"),
    (httpx.ReadError, "the connection broke while its answer was being read"),
    (httpx.WriteError, "the connection broke while the request was being sent"),
    (httpx.ConnectError, "nothing answered at that address"),
    (httpx.TimeoutException, "it did not answer in time"),
    (httpx.ProxyError, "a proxy between refused the connection"),
)
"""httpx's connection errors as a person reads them (its own messages are a protocol's words)."""


def in_words(err: httpx.HTTPError) -> str:
    """What went wrong with a connection, in words, without httpx's class names."""
    return next((words for kind, words in CONNECTION_FAULTS if isinstance(err, kind)), "the connection failed")


def headers(api_key: str | None, session: str | None = None) -> dict[str, str]:
    """Auth, and the conversation's id for the router (``session``: one per chat or simulated user)."""
    out = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if session:
        out[SESSION_HEADER] = session
    return out


@dataclass
class ChatResult:
    """One reply as it was timed: seconds are from ``t0`` (the request's start, or the moment
    the page received the user's message), so ``ttft_s`` is what the user waited."""

    text: str = ""
    ttft_s: float | None = None
    """Until the first generated token arrived (vLLM's first chunk, visible text or not)."""
    sent_s: float = 0.0
    """Until the request left for the engine: the page's own share of ``ttft_s``."""
    total_s: float = 0.0
    tokens: int = 0
    """Completion tokens as the engine counted them (usage), else content deltas seen."""
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    deltas: int = 0
    prompt_tokens: int | None = None
    """The prompt as the engine counted it (usage)."""
    cached_tokens: int | None = None
    """Prompt tokens the engine took from its prefix cache; None unless it reports them
    (``--enable-prompt-tokens-details``)."""
    engine_metrics: dict[str, float] = field(default_factory=dict)
    """vLLM's own timings of the request (``--enable-per-request-metrics``, on the stream's final
    usage chunk): ``queue_time_ms``, ``time_to_first_token_ms`` (from scheduling: the prefill),
    ``mean_itl_ms``, ...; empty when the engine does not report them."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.tokens > 0

    @property
    def engine_ttft_s(self) -> float | None:
        """The engine's share of the first-token wait (from sending the request)."""
        return None if self.ttft_s is None else self.ttft_s - self.sent_s

    @property
    def tokens_per_s(self) -> float:
        decode = self.total_s - (self.ttft_s or 0.0)
        return (self.tokens - 1) / decode if self.tokens > 1 and decode > 0 else 0.0

    @property
    def itl_s(self) -> list[float]:
        """Gaps between streamed chunks (inter-token latency)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]

    def absorb(self, chunk: dict[str, Any], now: float) -> str:
        """Apply one streamed chunk received at ``now``; returns its text (may be empty)."""
        if usage := chunk.get("usage"):
            self.tokens = usage.get("completion_tokens", self.tokens)
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            self.cached_tokens = cached if isinstance(cached, int) else self.cached_tokens
        if isinstance(metrics := chunk.get("metrics"), dict):
            self.engine_metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        text = ""
        for choice in chunk.get("choices") or []:
            if self.ttft_s is None:
                self.ttft_s = now
            piece = (choice.get("delta") or {}).get("content") or choice.get("text")
            if piece:
                self.token_times.append(now)
                self.deltas += 1
                text += piece
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        self.text += text
        return text

    def finish(self, now: float) -> None:
        self.total_s = now
        self.tokens = self.tokens or self.deltas


def chat_body(
    model: str, messages: list[dict[str, str]], *, max_tokens: int, stream: bool = True, **sampling: Any
) -> dict[str, Any]:
    """A ``/v1/chat/completions`` request; greedy unless ``sampling`` says otherwise."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": stream,
        "temperature": 0.0,
        **sampling,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def stream_chunks(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI server-sent-event stream, ``[DONE]`` excluded."""
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


async def _timed(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    hdrs: dict[str, str],
    whole: Callable[[dict[str, Any]], str],
) -> ChatResult:
    """POST ``body`` with ``hdrs`` and time the answer; ``whole`` reads a non-streamed answer's text. Never
    raises on HTTP errors: they are in ``error``."""
    res = ChatResult()
    t0 = time.perf_counter()
    try:
        if not body.get("stream"):
            r = await client.post(url, json=body, headers=hdrs)
            res.total_s = res.ttft_s = time.perf_counter() - t0
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {r.text[:300]}"
                return res
            data = r.json()
            res.text = whole(data["choices"][0]) or ""
            res.finish_reason = data["choices"][0].get("finish_reason")
            res.tokens = data.get("usage", {}).get("completion_tokens", 0)
            return res
        async with client.stream("POST", url, json=body, headers=hdrs) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}"
                return res
            async for chunk in stream_chunks(r):
                res.absorb(chunk, time.perf_counter() - t0)
    except httpx.HTTPError as err:
        res.error = f"{in_words(err)} ({err})" if str(err) else in_words(err)
    res.finish(time.perf_counter() - t0)
    return res


async def chat(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    messages: list[dict[str, str]],
    *,
    max_tokens: int = 32,
    stream: bool = True,
    api_key: str | None = None,
    extra: dict[str, Any] | None = None,
    session: str | None = None,
) -> ChatResult:
    """One chat completion against ``{base_url}/chat/completions``."""
    body = chat_body(model, messages, max_tokens=max_tokens, stream=stream, **(extra or {}))
    url = f"{base_url.rstrip('/')}/chat/completions"
    return await _timed(client, url, body, headers(api_key, session), lambda choice: choice["message"]["content"])


async def complete(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    prompt: str,
    *,
    max_tokens: int,
    stream: bool = True,
    api_key: str | None = None,
    extra: dict[str, Any] | None = None,
    session: str | None = None,
) -> ChatResult:
    """One plain completion against ``{base_url}/completions`` (no chat template)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    body.update({"temperature": 0.0, **(extra or {})})
    if stream:
        body["stream_options"] = {"include_usage": True}
    url = f"{base_url.rstrip('/')}/completions"
    return await _timed(client, url, body, headers(api_key, session), lambda choice: choice.get("text", ""))


@dataclass(frozen=True)
class Kind:
    """One path a request takes through vLLM: endpoint, streaming, and sampling or greedy."""

    endpoint: Literal["chat", "completions"]
    stream: bool
    sampled: bool

    @property
    def name(self) -> str:
        return f"{self.endpoint}/{'stream' if self.stream else 'whole'}/{'sampled' if self.sampled else 'greedy'}"


KINDS = tuple(Kind(e, s, m) for m in (True, False) for e in ("chat", "completions") for s in (True, False))
"""The page's own path (chat, streamed, sampled) first."""
BUILT_IN_SAMPLING = AppSettings().sampling()
"""The page's defaults when ``app`` sets none: what a measuring request of a sampled kind draws with."""


async def request(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    kind: Kind,
    text: str,
    *,
    max_tokens: int,
    sampling: Sampling = BUILT_IN_SAMPLING,
    api_key: str | None = None,
) -> ChatResult:
    """One request of ``kind`` whose reply is exactly ``max_tokens`` long (``ignore_eos``); a
    sampled kind draws as ``sampling`` says (its temperature and top-p)."""
    extra: dict[str, Any] = {"ignore_eos": True, **(sampling.draw_fields() if kind.sampled else {})}
    if kind.endpoint == "chat":
        messages = [{"role": "user", "content": text}]
        return await chat(
            client, base_url, model, messages, max_tokens=max_tokens, stream=kind.stream, api_key=api_key, extra=extra
        )
    return await complete(
        client, base_url, model, text, max_tokens=max_tokens, stream=kind.stream, api_key=api_key, extra=extra
    )


async def ask(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    text: str,
    *,
    max_tokens: int,
    api_key: str | None = None,
    stream: bool = True,
    session: str | None = None,
) -> ChatResult:
    """One user message with a reply of exactly ``max_tokens`` (``ignore_eos``): load for measuring.
    ``session``: a simulated user's id, so that the router spreads users, not requests."""
    return await chat(
        client,
        base_url,
        model,
        [{"role": "user", "content": text}],
        max_tokens=max_tokens,
        stream=stream,
        api_key=api_key,
        extra={"ignore_eos": True},
        session=session,
    )


# -- /v1/models and /tokenize -----------------------------------------------------------------
@dataclass(frozen=True)
class ServedModel:
    """One model the engine lists: its served name and context length (vLLM lists both)."""

    id: str
    max_model_len: int | None


def served_models(listing: Any) -> list[ServedModel]:
    """``/v1/models``' JSON as ServedModels (for a caller with its own HTTP client)."""
    data = listing.get("data") if isinstance(listing, dict) else None
    return [
        ServedModel(str(m.get("id", "?")), m.get("max_model_len") if isinstance(m.get("max_model_len"), int) else None)
        for m in data or []
        if isinstance(m, dict)
    ]


async def models(client: httpx.AsyncClient, base_url: str, api_key: str | None = None, **kw: Any) -> list[ServedModel]:
    """The served models with their max_model_len (``GET /v1/models``); httpx's errors as they are
    (an HTTP error status too), for the caller's own mapping (:func:`chat_errors`)."""
    r = await client.get(f"{base_url.rstrip('/')}/models", headers=headers(api_key), **kw)
    r.raise_for_status()
    return served_models(r.json())


async def count_tokens(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    messages: str | Sequence[Mapping[str, Any]],
    api_key: str | None = None,
    **kw: Any,
) -> int:
    """Prompt tokens of a conversation (a text: one user message) with the model's own tokenizer
    and chat template (``POST /tokenize``); httpx's errors as they are."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    body = {"model": model, "messages": list(messages)}
    r = await client.post(f"{root_url(base_url)}/tokenize", json=body, headers=headers(api_key), **kw)
    r.raise_for_status()
    return int(r.json()["count"])


# -- /metrics --------------------------------------------------------------------------------
_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        out.setdefault(m.group("name"), []).append((labels, value))
    return out


async def fetch_metrics(client: httpx.AsyncClient, base_url: str) -> Samples:
    r = await client.get(f"{root_url(base_url)}/metrics")
    r.raise_for_status()
    return parse_metrics(r.text)


def total(samples: Samples, name: str) -> float:
    return sum(v for _, v in samples.get(name, []))


def per_engine(samples: Samples, name: str) -> dict[str, float]:
    """Sum of a metric per ``engine`` label (one per data-parallel replica)."""
    out: dict[str, float] = {}
    for labels, value in samples.get(name, []):
        key = labels.get("engine", "0")
        out[key] = out.get(key, 0.0) + value
    return out
