"""What the chat page adds to what the engine does, against Chainlit's own floor.

In alternating rounds at each concurrency: ``c`` chats straight to vLLM (the project's timed
client), ``c`` new chats through the page's socket (a new conversation each, distinct
prompts, the page's sampling) and ``c`` through a do-nothing Chainlit echo app (its time to
first token is Chainlit's floor). The page's added first-token time is its median minus the
direct median; the target is at most the echo floor + 2 ms at one chat. Inter-token gaps are
compared per token (page within 5 % of direct): a reply's time from its first token to its last
over its tokens after the first. The page joins tokens into one socket message every
``app.stream_interval_ms``, so the gap between its messages (``itl_p50_ms``, kept for reference)
is not a gap between tokens.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field

import httpx

from backend.engine_api import ChatResult, chat
from backend.page_client import PageSession
from backend.prompts import prompt_of
from config.sampling import Sampling

PATHS = ("direct", "page", "echo")


@dataclass(frozen=True)
class FloorOptions:
    """Where to send, how many rounds, and the chat settings every path uses (the page gets them
    through its settings panel, its system prompt aside; the direct path in its request)."""

    base_url: str
    model: str
    page_url: str
    echo_url: str
    sampling: Sampling
    levels: Sequence[int] = (1, 16)
    rounds: int = 20
    api_key: str | None = None


@dataclass
class PathFigures:
    requests: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    """Median gap between two streamed pieces (the page's are joined tokens)."""
    token_gap_p50_ms: float | None = None
    """Median over replies of (last token's time − first token's) / (tokens − 1)."""
    first_errors: list[str] = field(default_factory=list)
    """What the first few failed requests said (an error here is a finding, not noise)."""


@dataclass
class LevelFigures:
    concurrency: int
    paths: dict[str, PathFigures] = field(default_factory=dict)
    page_added_ttft_ms: float | None = None
    """Page p50 TTFT − direct p50 TTFT."""
    echo_floor_ms: float | None = None
    """The echo app's p50 TTFT: what Chainlit itself costs."""
    page_itl_over_direct: float | None = None
    """Page's per-token gap (``token_gap_p50_ms``) over direct's."""


def _ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def figures(results: list[ChatResult]) -> PathFigures:
    ok = [r for r in results if r.error is None and r.ttft_s is not None]
    gaps = [g for r in ok for g in r.itl_s]
    per_token = [(r.token_times[-1] - r.token_times[0]) / (r.tokens - 1) for r in ok if r.tokens > 1 and r.token_times]
    return PathFigures(
        requests=len(results),
        errors=len(results) - len(ok),
        ttft_p50_ms=round(1000 * statistics.median([r.ttft_s or 0.0 for r in ok]), 2) if ok else None,
        ttft_p99_ms=_ms([r.ttft_s or 0.0 for r in ok], 0.99),
        itl_p50_ms=round(1000 * statistics.median(gaps), 3) if gaps else None,
        token_gap_p50_ms=round(1000 * statistics.median(per_token), 3) if per_token else None,
        first_errors=[str(r.error) for r in results if r.error is not None][:3],
    )


async def _through_page(url: str, text: str, opts: FloorOptions) -> ChatResult:
    tab = await PageSession(url).connect()
    try:
        s = opts.sampling
        await tab.set_settings(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens)
        return await tab.ask(text)
    finally:
        await tab.close()


async def measure_floor(opts: FloorOptions, say: Callable[[str], None] = print) -> list[LevelFigures]:
    """Every level's figures; alternating rounds so that drift on the machine hits all paths alike."""
    out: list[LevelFigures] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=5.0), limits=limits) as http:

        async def direct(text: str) -> ChatResult:
            messages = [{"role": "user", "content": text}]
            return await chat(
                http,
                opts.base_url,
                opts.model,
                messages,
                max_tokens=opts.sampling.max_tokens,
                api_key=opts.api_key,
                extra=opts.sampling.draw_fields(),
            )

        runners: dict[str, Callable[[str], Awaitable[ChatResult]]] = {
            "direct": direct,
            "page": lambda text: _through_page(opts.page_url, text, opts),
            "echo": lambda text: _through_page(opts.echo_url, text, opts),
        }
        for c in opts.levels:
            results: dict[str, list[ChatResult]] = {p: [] for p in PATHS}
            for rnd in range(opts.rounds):
                for path in PATHS:
                    batch = await asyncio.gather(*(runners[path](prompt_of(24)) for _ in range(c)))
                    results[path].extend(batch)
                if (rnd + 1) % 5 == 0:
                    say(f"  c={c}: {rnd + 1}/{opts.rounds} rounds")
            level = LevelFigures(concurrency=c, paths={p: figures(results[p]) for p in PATHS})
            d, pg, e = (level.paths[p] for p in PATHS)
            if d.ttft_p50_ms is not None and pg.ttft_p50_ms is not None:
                level.page_added_ttft_ms = round(pg.ttft_p50_ms - d.ttft_p50_ms, 2)
            level.echo_floor_ms = e.ttft_p50_ms
            if d.token_gap_p50_ms and pg.token_gap_p50_ms:
                level.page_itl_over_direct = round(pg.token_gap_p50_ms / d.token_gap_p50_ms, 3)
            out.append(level)
    return out


def as_json(levels: list[LevelFigures]) -> list[dict[str, object]]:
    return [asdict(level) for level in levels]
