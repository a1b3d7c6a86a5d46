"""What the product asks of a vLLM server's front end, checked against a running one: each request
the page, the warm-up, ``serve`` and the router make, through the project's own client code
(``backend/engine_api.py``). Run it against a server with Python API servers and one with vLLM's
Rust frontend (``VLLM_USE_RUST_FRONTEND=1``) to see what either loses. One JSON line per check,
then a summary line; exit code 1 when a check fails.

    .venv/bin/python benchmarks/frontend_check.py URL SERVED_NAME [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's own client, run by path
from backend.engine_api import (
    KINDS,
    chat,
    count_tokens,
    fetch_metrics,
    models,
    per_engine,
    request,
    total,
)

PROMPT = "Tell me about the history of the river that runs through the old town, in detail. " * 12
"""About 200 tokens: more than a few KV blocks, so a second request finds it in the prefix cache."""


async def run_checks(root: str, served: str) -> list[dict[str, Any]]:
    base = f"{root.rstrip('/')}/v1"
    results: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=60) as http:

        async def check(name: str, body: Callable[[], Awaitable[str]]) -> None:
            t0 = time.perf_counter()
            try:
                detail, ok = await body(), True
            except Exception as err:  # a check that breaks is a failed check, with what broke
                detail, ok = f"{type(err).__name__}: {err}", False
            results.append({"check": name, "ok": ok, "detail": detail, "s": round(time.perf_counter() - t0, 3)})

        async def health() -> str:
            r = await http.get(f"{root}/health")
            assert r.status_code == 200, f"HTTP {r.status_code}"
            return "200"

        async def listed() -> str:
            found = await models(http, base)
            mine = [m for m in found if m.id == served]
            assert mine, f"{served} not in {[m.id for m in found]}"
            assert mine[0].max_model_len, "no max_model_len"
            return f"{served}, max_model_len {mine[0].max_model_len}"

        async def tokenize() -> str:
            n = await count_tokens(http, base, served, "Hello there")
            assert n > 0
            return f"{n} tokens"

        async def kinds() -> str:
            out = []
            for kind in KINDS:
                res = await request(http, base, served, kind, "Count to ten.", max_tokens=24)
                assert res.error is None and res.tokens == 24, f"{kind.name}: {res.error or res.tokens}"
                out.append(kind.name)
            return f"{len(out)} kinds, 24 tokens each"

        async def usage_and_cache() -> str:
            msgs = [{"role": "user", "content": PROMPT}]
            first = await chat(http, base, served, msgs, max_tokens=8, extra={"ignore_eos": True})
            again = await chat(http, base, served, msgs, max_tokens=8, extra={"ignore_eos": True})
            assert again.prompt_tokens, "no prompt_tokens in the stream's usage"
            assert again.cached_tokens, f"no cached prompt tokens reported ({again.cached_tokens})"
            return f"prompt {again.prompt_tokens}, cached {again.cached_tokens} (first {first.cached_tokens})"

        async def metrics() -> str:
            samples = await fetch_metrics(http, base)
            done = per_engine(samples, "vllm:request_success_total")
            assert done, "no vllm:request_success_total"
            return f"request_success_total per engine {done}"

        async def abort_on_disconnect() -> str:
            body = {
                "model": served,
                "messages": [{"role": "user", "content": "Write a very long story."}],
                "max_tokens": 8000,
                "stream": True,
                "ignore_eos": True,
            }
            async with http.stream("POST", f"{base}/chat/completions", json=body) as r:
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= 5:
                        break
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 5:
                running = total(await fetch_metrics(http, base), "vllm:num_requests_running")
                if running == 0:
                    return f"aborted {time.perf_counter() - t0:.2f} s after the client closed"
                await asyncio.sleep(0.05)
            raise AssertionError("still running 5 s after the client closed")

        async def refused() -> str:
            body = {"model": served, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}
            r = await http.post(f"{base}/chat/completions", json=body)
            assert 400 <= r.status_code < 500, f"HTTP {r.status_code}"
            return f"HTTP {r.status_code}: {r.text[:160]}"

        for name, body in (
            ("health", health),
            ("models", listed),
            ("tokenize", tokenize),
            ("request kinds", kinds),
            ("usage and prompt-token details", usage_and_cache),
            ("metrics", metrics),
            ("abort on disconnect", abort_on_disconnect),
            ("bad request refused", refused),
        ):
            await check(name, body)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the server's root, e.g. http://127.0.0.1:8000")
    parser.add_argument("served", help="its served model name")
    parser.add_argument("--out", type=Path, help="also write the JSON lines here")
    args = parser.parse_args()
    results = asyncio.run(run_checks(args.url, args.served))
    lines = [json.dumps(r) for r in results]
    failed = [r["check"] for r in results if not r["ok"]]
    lines.append(json.dumps({"summary": f"{len(results) - len(failed)} of {len(results)} passed", "failed": failed}))
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
