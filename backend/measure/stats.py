"""The numbers of a load level: percentiles, time per output token, and one level's record.

:class:`Level` is what bench, tune and their reports share: ``summarize`` makes it from the
replies of one level; ``bench.json`` and ``tune.json`` hold it under the same keys as always.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, model_serializer

from backend.engine_api import ChatResult

CLIENT_FIGURES = ("client_processes", "client_busy")
"""Measured only when a load generator ran the level; absent from the JSON otherwise."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(values: Sequence[float]) -> float | None:
    """The median; None for no values."""
    return statistics.median(values) if values else None


BOOTSTRAP_ROUNDS = 1000


def ratio_of_medians(
    first: Sequence[float], second: Sequence[float], rounds: int = BOOTSTRAP_ROUNDS
) -> tuple[float, float, float] | None:
    """median(second) / median(first), and its spread: the 5th and 95th percentile of the same ratio over
    ``rounds`` bootstrap resamples of both series (a fixed seed: the same rows give the same interval).
    None when either series is empty or the first's median is 0."""
    if not first or not second or not statistics.median(first):
        return None
    draw = random.Random(0)
    ratios = []
    for _ in range(rounds):
        a = statistics.median(draw.choices(first, k=len(first)))
        b = statistics.median(draw.choices(second, k=len(second)))
        if a:
            ratios.append(b / a)
    low, high = percentile(ratios, 5), percentile(ratios, 95)
    assert low is not None and high is not None
    return statistics.median(second) / statistics.median(first), low, high


def ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds, two decimals; None stays None."""
    return None if seconds is None else round(seconds * 1000, 2)


def tpot_s(res: ChatResult) -> float | None:
    """Time per output token after the first: (end-to-end − TTFT) / (tokens − 1)."""
    if res.ttft_s is None or res.tokens < 2:
        return None
    return (res.total_s - res.ttft_s) / (res.tokens - 1)


class Level(BaseModel):
    """One load level: ``concurrency`` at a time, ``requests`` sent; latencies at p50/p99 in ms."""

    concurrency: int
    requests_planned: int = 0
    requests: int = 0
    ok: int = 0
    errors: int = 0
    cut_off: int = 0
    """Requests still running when the level's drain time ran out (cut off, not errors)."""
    error_samples: list[str] = []
    wall_s: float = 0.0
    output_tokens: int = 0
    tokens_per_request_mean: float = 0.0
    output_tokens_per_s: float = 0.0
    requests_per_s: float = 0.0
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    itl_max_ms: float | None = None
    """The longest stall between two tokens of any reply."""
    short_replies: int = 0
    """Replies that ended before max_tokens (the page cannot ask for ignore_eos)."""
    client_processes: int | None = None
    client_busy: float | None = None
    """CPU share of the busiest client process; near 1 means the client may have been the limit."""

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any) -> dict[str, Any]:
        return self.json_shape(handler(self))

    def json_shape(self, data: dict[str, Any]) -> dict[str, Any]:
        """The dumped fields as the JSON files hold them: the client's figures only when measured."""
        for key in CLIENT_FIGURES:
            if data.get(key) is None:
                data.pop(key, None)
        return data


def summarize(
    results: Sequence[ChatResult], *, concurrency: int, planned: int, wall_s: float, cut_off: int = 0
) -> Level:
    """One level's numbers: TTFT, ITL, TPOT, end-to-end at p50/p99, the longest stall between
    tokens (a seconds-long gap hides under p99 in a long reply), tokens/s, requests/s, errors."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [gap for r in ok for gap in r.itl_s]
    tpot = [t for r in ok if (t := tpot_s(r)) is not None]
    e2e = [r.total_s for r in ok]
    tokens = sum(r.tokens for r in ok)
    return Level(
        concurrency=concurrency,
        requests_planned=planned,
        requests=len(results),
        ok=len(ok),
        errors=len(failed),
        cut_off=cut_off,
        error_samples=sorted({(r.error or "no tokens")[:200] for r in failed})[:3],
        wall_s=round(wall_s, 3),
        output_tokens=tokens,
        tokens_per_request_mean=round(tokens / len(ok), 1) if ok else 0.0,
        output_tokens_per_s=round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        requests_per_s=round(len(ok) / wall_s, 3) if wall_s > 0 else 0.0,
        ttft_p50_ms=ms(percentile(ttft, 50)),
        ttft_p99_ms=ms(percentile(ttft, 99)),
        itl_p50_ms=ms(percentile(itl, 50)),
        itl_p99_ms=ms(percentile(itl, 99)),
        tpot_p50_ms=ms(percentile(tpot, 50)),
        tpot_p99_ms=ms(percentile(tpot, 99)),
        e2e_p50_ms=ms(percentile(e2e, 50)),
        e2e_p99_ms=ms(percentile(e2e, 99)),
        itl_max_ms=ms(max(itl) if itl else None),
    )
