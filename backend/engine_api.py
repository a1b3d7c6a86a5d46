"""What every part of the project shares about the engine's OpenAI-compatible API.

Its URL from the bind host, auth headers, one timed streaming parser (used by warm-up, bench,
tests and the chat page, so every latency figure is measured the same way: from sending the
request to the first content delta) and vLLM's Prometheus ``/metrics``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class ChatResult:
    text: str = ""
    ttft_s: float | None = None
    total_s: float = 0.0
    tokens: int = 0
    """Completion tokens as the engine counted them (usage), else content deltas seen."""
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.tokens > 0

    @property
    def tokens_per_s(self) -> float:
        decode = self.total_s - (self.ttft_s or 0.0)
        return (self.tokens - 1) / decode if self.tokens > 1 and decode > 0 else 0.0

    @property
    def itl_s(self) -> list[float]:
        """Gaps between streamed chunks (inter-token latency)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


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
) -> ChatResult:
    """One chat completion against ``{base_url}/chat/completions``; never raises on HTTP errors."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": stream,
        "temperature": 0.0,
        **(extra or {}),
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    res = ChatResult()
    t0 = time.perf_counter()
    url = f"{base_url.rstrip('/')}/chat/completions"
    try:
        if not stream:
            r = await client.post(url, json=body, headers=headers(api_key))
            res.total_s = time.perf_counter() - t0
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {r.text[:300]}"
                return res
            data = r.json()
            res.text = data["choices"][0]["message"]["content"] or ""
            res.finish_reason = data["choices"][0].get("finish_reason")
            res.tokens = data.get("usage", {}).get("completion_tokens", 0)
            res.ttft_s = res.total_s
            return res
        async with client.stream("POST", url, json=body, headers=headers(api_key)) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}"
                return res
            deltas = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    res.tokens = chunk["usage"].get("completion_tokens", res.tokens)
                for choice in chunk.get("choices", []):
                    piece = choice.get("delta", {}).get("content")
                    if piece:
                        now = time.perf_counter() - t0
                        if res.ttft_s is None:
                            res.ttft_s = now
                        res.token_times.append(now)
                        res.text += piece
                        deltas += 1
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
            res.tokens = res.tokens or deltas
    except httpx.HTTPError as err:
        res.error = f"{type(err).__name__}: {err}"
    res.total_s = time.perf_counter() - t0
    return res


async def ask(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    text: str,
    *,
    max_tokens: int,
    api_key: str | None = None,
    stream: bool = True,
) -> ChatResult:
    """One user message with a reply of exactly ``max_tokens`` (``ignore_eos``): load for measuring."""
    return await chat(
        client,
        base_url,
        model,
        [{"role": "user", "content": text}],
        max_tokens=max_tokens,
        stream=stream,
        api_key=api_key,
        extra={"ignore_eos": True},
    )


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


def root_url(base_url: str) -> str:
    """``http://h:p/v1`` -> ``http://h:p``: /metrics, /health and /tokenize live at the root."""
    return base_url.rstrip("/").removesuffix("/v1")


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
