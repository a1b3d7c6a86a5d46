"""Warm the engine with requests shaped like users' before anyone is let in.

Measured on H200: the first request after start costs ~40x a warm one (a kernel compiled
on first use), once per replica, and the first request with sampling (the page's
temperature / top-p) after greedy-only requests x4-5 again: each request path compiles its
own kernels. So every path a request can take is warmed: chat and plain completions,
streamed and not, greedy and with the page's sampling (:data:`KINDS`); short, medium and
long prompts, once each on the page's path (a prompt's length shapes the engine's kernels,
not the path it came by: on CPU each of the 8 paths' long prompt cost a second); alone, at
the planned concurrency, and a full prefill chunk of concurrent medium prompts; until every
replica has answered. Each request must return tokens. The record (first against steady
first-token latency, per path) also sets the chat page's first-token timeout.

The three prompts go once more alone once everything is compiled, then a short prompt with a longer
reply on the page's path, alone and several at once, greedy and drawn as the page draws; every timed
request is kept as a sample (``WarmupSample``): the performance model calibrates this host's costs from
them, a drawn token's cost apart from a greedy one's.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import httpx

from backend.engine_api import KINDS, ChatResult, Kind, count_tokens, fetch_metrics, per_engine, request
from backend.errors import WarmupError
from backend.prompts import LONG_CAP, prompt_of, sized_prompt, tokens_per_word
from backend.runtime.status import KindWarmth, WarmupRecord
from config.performance.calibrate import WarmupSample
from config.plan import Plan
from config.sampling import Sampling

REPLY_TOKENS = 16
MAX_ROUNDS = 6
STEADY_PER_KIND = 2
LONGER_REPLY_TOKENS = 64
"""The longer replies: how far apart their tokens come, alone and several at once, gives the per-step and
per-sequence costs (``config.performance.calibrate``)."""
LONGER_ALONE = 3
"""Longer replies alone, each greedy and drawn."""
LONGER_TOGETHER = 16
"""Short prompts with the longer reply at once, at most (fewer for fewer users or batch slots): the
per-sequence cost."""


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


async def warm_up(
    base_url: str,
    model: str,
    plan: Plan,
    *,
    users: int,
    prompt_tokens: int,
    sampling: Sampling,
    api_key: str | None = None,
    on_progress: Callable[[str, float], None] | None = None,
    replicas: int | None = None,
) -> WarmupRecord:
    """Run the warm-up; the record it returns is saved beside the status. Raises WarmupError.
    ``sampling``: the page's (its sampled requests draw as a user's do; replies stay
    ``REPLY_TOKENS`` long).
    ``replicas``: vLLM replicas behind ``base_url`` (default the plan's data_parallel_size; one
    for each server of a routed plan)."""
    replicas = replicas or plan.data_parallel_size
    say = on_progress or (lambda _msg, _frac: None)
    t0 = time.perf_counter()
    results: list[tuple[str, ChatResult]] = []
    samples: list[WarmupSample] = []
    timeout = httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=600.0)
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def one(
            shape: str,
            words: int,
            kind: Kind = KINDS[0],
            *,
            together: int = 1,
            rnd: int = 0,
            tokens: int = 0,
            reply: int = REPLY_TOKENS,
        ) -> ChatResult:
            res = await request(
                client,
                base_url,
                model,
                kind,
                prompt_of(words),
                max_tokens=reply,
                sampling=sampling,
                api_key=api_key,
            )
            results.append((shape, res))
            if not res.ok:
                raise WarmupError(f"warm-up request ({shape}, {kind.name}) failed: {res.error or 'no tokens'}")
            if kind.stream and shape in SAMPLED_SHAPES:
                drawn = kind.sampled and sampling.draws
                samples.append(_sample(shape, res, together, rnd, tokens, plan.stream_interval, drawn))
            return res

        say("first request", 0.0)
        firsts = {kind.name: await one("first", 12, kind) for kind in KINDS}
        long_tokens = min(plan.max_model_len - REPLY_TOKENS - 64, LONG_CAP[plan.device])
        medium_tokens = min(prompt_tokens, long_tokens)
        per_word = await tokens_per_word(client, base_url, model, api_key)
        med_words, med_n = sized_prompt(medium_tokens, per_word)
        long_words, long_n = sized_prompt(long_tokens, per_word)
        short_n = await count_tokens(client, base_url, model, prompt_of(12), api_key)
        shapes = [("short", 12, short_n), ("medium", med_words, med_n), ("long", long_words, long_n)]
        for i, (shape, words, _) in enumerate(shapes):
            say(f"{shape} prompt", 0.1 + 0.1 * i)
            await one(shape, words)  # a prompt's length shapes the engine's kernels, whatever its path

        concurrency = max(1, min(plan.max_num_seqs, max(users, 2 * replicas)))
        # a full prefill chunk of concurrent medium prompts (the first bench level's cold tail)
        chunk = max(1, min(plan.max_num_seqs, plan.max_num_batched_tokens // max(med_n, 1)))
        say(f"{chunk} concurrent medium prompts", 0.35)
        await asyncio.gather(*(one("prefill", med_words, KINDS[j % len(KINDS)]) for j in range(chunk)))
        replicas_seen: list[str] = []
        rounds: list[list[float]] = []
        for rnd in range(MAX_ROUNDS):
            say(f"{concurrency} concurrent requests (round {rnd + 1})", 0.4 + 0.1 * rnd)
            batch = await asyncio.gather(
                *(
                    one(
                        "concurrent",
                        12 + j % 3 * med_words // 3,
                        KINDS[j % len(KINDS)],
                        together=concurrency,
                        rnd=rnd + 1,
                    )
                    for j in range(concurrency)
                )
            )
            rounds.append([r.ttft_s or 0.0 for r in batch])
            replicas_seen = await _replicas_served(client, base_url)
            every_replica = len(replicas_seen) >= replicas
            stable = len(rounds) >= 2 and max(rounds[-1]) <= 2 * max(_median(rounds[-1]), 1e-3)
            if every_replica and stable:
                break
        if len(replicas_seen) < replicas:
            raise WarmupError(f"only replicas {replicas_seen} answered during warm-up; {replicas} were started")

        say("each prompt again, alone", 0.92)
        for shape, words, tokens in shapes:
            await one(f"{shape} {AGAIN}", words, tokens=tokens)
        say("steady state", 0.95)
        steadies = {kind.name: [await one("steady", 12, kind) for _ in range(STEADY_PER_KIND)] for kind in KINDS}
        # on the page's own path (chat, streamed), as users' replies come: greedy and drawn as the page draws,
        # the draw's own cost apart
        say("longer replies, alone and together", 0.97)
        page_kind = KINDS[0]
        greedy = replace(page_kind, sampled=False)
        for i in range(2 * LONGER_ALONE):
            await one("reply", 12, (greedy, page_kind)[i % 2], reply=LONGER_REPLY_TOKENS)
        crowd = max(1, min(concurrency, plan.max_num_seqs, LONGER_TOGETHER))
        for kind in (greedy, page_kind):
            await asyncio.gather(
                *(one("decode", 12, kind, together=crowd, reply=LONGER_REPLY_TOKENS) for _ in range(crowd))
            )

    by_kind = {
        name: KindWarmth(
            first_ttft_s=round(firsts[name].ttft_s or 0.0, 4),
            steady_ttft_s=round(_median([r.ttft_s or 0.0 for r in steadies[name]]), 4),
        )
        for name in firsts
    }
    page = by_kind[KINDS[0].name]
    steady_ttft, first_ttft = page.steady_ttft_s, page.first_ttft_s
    by_shape: dict[str, dict[str, float]] = {}
    for shape, res in results:
        entry = by_shape.setdefault(shape, {"requests": 0, "max_ttft_s": 0.0})
        entry["requests"] += 1
        entry["max_ttft_s"] = max(entry["max_ttft_s"], res.ttft_s or 0.0)
    return WarmupRecord(
        first_ttft_s=round(first_ttft, 4),
        steady_ttft_s=round(steady_ttft, 4),
        first_over_steady=round(first_ttft / steady_ttft, 1) if steady_ttft else None,
        max_ttft_s=round(max((r.ttft_s or 0.0) for _, r in results), 4),
        requests=len(results),
        concurrency=concurrency,
        concurrent_ttft_p50_s=round(_median(rounds[-1]), 4),
        rounds=len(rounds),
        prompt_tokens={"short": short_n, "medium": med_n, "long": long_n},
        replicas=replicas,
        replicas_warmed=replicas_seen,
        by_shape=by_shape,
        by_kind=by_kind,
        duration_s=round(time.perf_counter() - t0, 2),
        samples=samples,
    )


AGAIN = "again"
SAMPLED_SHAPES = (
    "short",
    "medium",
    "long",
    f"short {AGAIN}",
    f"medium {AGAIN}",
    f"long {AGAIN}",
    "concurrent",
    "steady",
    "reply",
    "decode",
)
"""The shapes kept as samples: each prompt alone (twice), the concurrent rounds, the steady requests, the
longer replies alone and together."""


def _sample(
    shape: str, res: ChatResult, together: int, rnd: int, tokens: int, interval: int, drawn: bool
) -> WarmupSample:
    """A timed request as the calibration reads it; its prompt as the engine counted it, where it said; how
    far apart its tokens came (its chunks of ``interval`` tokens), where it streamed three chunks or more;
    ``drawn``: its tokens drawn at random."""
    gaps = res.itl_s
    return WarmupSample(
        shape=shape.removesuffix(f" {AGAIN}"),
        prompt_tokens=res.prompt_tokens or tokens or 1,
        concurrency=together,
        round=rnd,
        ttft_s=round(res.ttft_s or 0.0, 5),
        total_s=round(res.total_s, 5),
        tokens=res.tokens,
        gap_s=round(statistics.median(gaps) / max(interval, 1), 6) if len(gaps) >= 2 else None,
        sampled=drawn,
    )


async def _replicas_served(client: httpx.AsyncClient, base_url: str) -> list[str]:
    """Replica (engine) labels that have finished at least one request, from /metrics."""
    try:
        samples = await fetch_metrics(client, base_url)
    except httpx.HTTPError:
        return []
    done = per_engine(samples, "vllm:request_success_total")
    return sorted(k for k, v in done.items() if v > 0)
