"""``bench-startup``: what start-up costs, and what warm-up saves the first user.

With warm-up on and off in turn: start the engine (its own run dir and port), time launch to
ready, then send the first user request and a few more (distinct prompts) and record their
time to first token. Without warm-up the first user pays for what vLLM does on first use
(kernel compilation, allocator growth); with it, the first user sees the steady state.
Output: a table, ``startup.json`` and ``startup.png`` (``plots.plot_startup``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from backend.engine_api import ask
from backend.measure.prompts import prompt_of
from backend.runtime.process import free_port
from backend.runtime.serve import logged_server
from config.settings import Settings

USER_REQUESTS = 6
REPLY_TOKENS = 16


async def _user_requests(base_url: str, model: str, api_key: str | None, n: int) -> list[float]:
    """TTFT of ``n`` sequential user-like requests (distinct prompts, so no prefix-cache hits)."""
    out: list[float] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0)) as client:
        for _ in range(n):
            res = await ask(client, base_url, model, prompt_of(40), max_tokens=REPLY_TOKENS, api_key=api_key)
            if not res.ok:
                raise RuntimeError(f"request failed: {res.error}")
            out.append(res.ttft_s or 0.0)
    return out


def measure_start(settings: Settings, *, warmup: bool, run_dir: Path) -> dict[str, Any]:
    s = settings.model_copy(deep=True)
    s.engine.warmup = warmup
    s.engine.port = free_port()
    s.engine.run_dir = run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    with logged_server(s, run_dir / "serve.log") as server:
        t0 = time.monotonic()
        if not server.start():
            return {"warmup": warmup, "ok": False, "error": server.status.error}
        ready_s = time.monotonic() - t0
        assert server.planned is not None
        ttfts = asyncio.run(
            _user_requests(server.base_url, server.planned.plan.served_name, s.engine.api_key, USER_REQUESTS)
        )
        return {
            "warmup": warmup,
            "ok": True,
            "ready_s": round(ready_s, 1),
            "startup": server.status.startup,
            "plan": server.planned.plan.summary(),
            "first_user_ttft_s": round(ttfts[0], 4),
            "steady_ttft_s": round(statistics.median(ttfts[1:]), 4),
            "user_ttfts_s": [round(t, 4) for t in ttfts],
            "warmup_record": server.status.warmup.model_dump() if server.status.warmup else None,
        }
