"""One streamed reply from the engine into the page, timed as the user waits for it.

The request goes out through the project's one stream parser (``engine_api``), so the page
measures exactly as warm-up, bench and the tests do. Times count from ``t0``: the moment the
page received the user's message, so the footer's first-token time includes the page's own
share (``sent_s``) as well as the engine's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from backend.engine_api import ChatResult, chat_body, chat_errors, headers, stream_chunks
from backend.errors import EngineRefused, EngineTimeout
from backend.page.history import Message
from backend.page.link import EngineLink, Target
from config.sampling import Sampling


async def stream_reply(
    link: EngineLink,
    target: Target,
    messages: list[Message],
    sampling: Sampling,
    on_token: Callable[[str], Awaitable[None]],
    result: ChatResult | None = None,
    t0: float | None = None,
    session: str | None = None,
    prompt_tokens: int = 0,
    on_accepted: Callable[[], Awaitable[None]] | None = None,
) -> ChatResult:
    """Stream one reply into ``on_token``. The first delta goes out at once, later ones joined
    at most every ``app.stream_interval_ms`` (the page keeps up with any engine; timing stays
    per delta). The response is always closed on the way out, also when the task is cancelled
    (Stop), so vLLM sees the disconnect and aborts the request. ``session``: the chat's id, so
    that the router keeps the conversation on the engine that holds its prefix. ``prompt_tokens``:
    the request's size (or its bound), which a long prompt's first-token deadline grows with.
    ``on_accepted``: awaited once the engine has answered 200, before its first token, so that what
    the page shows meanwhile (the empty reply) goes out during the prefill, not before the request."""
    http = link.client(target)
    timeouts = link.timeouts(target.status, prompt_tokens)
    res = result if result is not None else ChatResult()
    start = time.perf_counter() if t0 is None else t0
    interval = link.settings.app.stream_interval_ms / 1000
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
            return timeouts.first_token - (time.perf_counter() - start - res.sent_s)
        return timeouts.between_tokens

    body = chat_body(
        target.model,
        messages,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
    )
    url = f"{target.base_url}/chat/completions"
    try:
        res.sent_s = time.perf_counter() - start
        with chat_errors(target.base_url, replying=lambda: res.ttft_s is not None):
            async with http.stream(
                "POST", url, json=body, headers=headers(target.api_key, session), timeout=timeouts.for_httpx()
            ) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    raise EngineRefused(
                        f"The engine refused the request: HTTP {response.status_code} {text[:300]}",
                        response.status_code,
                    )
                if on_accepted is not None:
                    await on_accepted()
                chunks = stream_chunks(response)
                while True:
                    try:
                        async with asyncio.timeout(max(left(), 0.001)):
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    now = time.perf_counter() - start
                    piece = res.absorb(chunk, now)
                    if piece:
                        pending.append(piece)
                        if now - flushed_at >= interval:
                            await flush(now)
                await flush(time.perf_counter() - start)
    except TimeoutError:
        if res.ttft_s is None:
            raise EngineTimeout(
                f"No first token within {timeouts.first_token:.0f} s (the engine is overloaded or stuck)."
            ) from None
        raise EngineTimeout(f"The engine went silent for {timeouts.between_tokens:.0f} s mid-reply.") from None
    finally:
        res.finish(time.perf_counter() - start)
    return res
