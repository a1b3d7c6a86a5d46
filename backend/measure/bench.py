"""``bench``: load a running engine at several concurrencies and say what it delivers.

Straight to vLLM (the project's streaming ``chat()``, ``ignore_eos`` so every reply has the
same length) and, with ``--page``, through the Chainlit page's socket with prompts of the same
shapes, so the page's own cost shows as added first-token time. Each level is closed-loop:
``concurrency`` workers each send the next request as soon as their last one ends, until the
level's request count or its time cap is reached. Prompts are distinct (``prompt_of``: a fresh
nonce each), so the prefix cache never answers for the engine.

Output: a table on stdout, ``bench.json`` (all numbers, hardware, plan, engine version,
timestamps) and ``bench.png`` (TTFT p50/p99 and tokens/s against concurrency; skipped with a
note when matplotlib is missing).
"""

from __future__ import annotations

import asyncio
import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from backend.engine_api import ChatResult, ask, headers, root_url
from backend.errors import UsageError
from backend.measure.loadgen import Span, client_processes, fan_out, merge, split
from backend.measure.prompts import LONG_CAP, count_tokens, prompt_of, sized_prompt, tokens_per_word

DEFAULT_LEVELS = (1, 4, 16, 64)
DEFAULT_MAX_TOKENS = 128
DEFAULT_MIX = ("short", "medium", "long")
SHORT_WORDS = 12
LEVEL_TIME_CAP_S = 120.0
"""No new request starts after this many seconds in one level."""
DRAIN_S = 60.0
"""Requests still running this long after the cap are cut off (counted, not errors)."""
PROMPT_MARGIN = 64
"""Tokens kept free below max_model_len besides the reply (chat template, rounding)."""
KEEPALIVE_VARIANTS = {"on": (True,), "off": (False,), "both": (True, False)}


# -- numbers ------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


def tpot_s(res: ChatResult) -> float | None:
    """Time per output token after the first: (end-to-end − TTFT) / (tokens − 1)."""
    if res.ttft_s is None or res.tokens < 2:
        return None
    return (res.total_s - res.ttft_s) / (res.tokens - 1)


def summarize(
    results: Sequence[ChatResult], *, concurrency: int, planned: int, wall_s: float, cut_off: int = 0
) -> dict[str, Any]:
    """One level's numbers: TTFT, ITL, TPOT, end-to-end at p50/p99, the longest stall between
    tokens (a seconds-long gap hides under p99 in a long reply), tokens/s, requests/s, errors."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [gap for r in ok for gap in r.itl_s]
    tpot = [t for r in ok if (t := tpot_s(r)) is not None]
    e2e = [r.total_s for r in ok]
    tokens = sum(r.tokens for r in ok)
    out: dict[str, Any] = {
        "concurrency": concurrency,
        "requests_planned": planned,
        "requests": len(results),
        "ok": len(ok),
        "errors": len(failed),
        "cut_off": cut_off,
        "error_samples": sorted({(r.error or "no tokens")[:200] for r in failed})[:3],
        "wall_s": round(wall_s, 3),
        "output_tokens": tokens,
        "tokens_per_request_mean": round(tokens / len(ok), 1) if ok else 0.0,
        "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        "requests_per_s": round(len(ok) / wall_s, 3) if wall_s > 0 else 0.0,
    }
    for name, values in (("ttft", ttft), ("itl", itl), ("tpot", tpot), ("e2e", e2e)):
        out[f"{name}_p50_ms"] = _ms(percentile(values, 50))
        out[f"{name}_p99_ms"] = _ms(percentile(values, 99))
    out["itl_max_ms"] = _ms(max(itl) if itl else None)
    return out


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--concurrency {text!r}: expected comma-separated whole numbers, e.g. 1,4,16,64") from None
    if not levels or levels[0] < 1:
        raise UsageError(f"--concurrency {text!r}: levels must be 1 or more")
    return levels


def cap_levels(levels: Sequence[int], cap: int | None) -> tuple[list[int], str | None]:
    """Levels above what the engine admits at once (max_num_seqs x replicas) become the cap."""
    if not cap:
        return sorted(set(levels)), None
    capped = sorted({min(c, cap) for c in levels})
    over = [c for c in levels if c > cap]
    note = None
    if over:
        note = (
            f"concurrency {', '.join(map(str, over))} capped at {cap} (max_num_seqs x replicas of the "
            "running plan): more would only queue inside the engine"
        )
    return capped, note


def requests_for(concurrency: int, n: int | None) -> int:
    """Requests per level: ``n``, else max(8, 2 x concurrency)."""
    return n if n else max(8, 2 * concurrency)


# -- prompts ------------------------------------------------------------------------------
async def prompt_shapes(
    base_url: str,
    model: str,
    mix: Sequence[str],
    *,
    api_key: str | None,
    max_tokens: int,
    prompt_tokens: int,
    max_model_len: int | None,
    device: str = "cuda",
) -> dict[str, dict[str, int]]:
    """``{name: {words, tokens}}`` for each item of the mix, measured with the model's tokenizer.

    short: a dozen words; medium: the workload's prompt length; long: 4x that, within the
    context (max_model_len − reply − margin) and the warm-up's cap for the device. A number in
    the mix is a prompt length in tokens.
    """
    room = (max_model_len or 1 << 30) - max_tokens - PROMPT_MARGIN
    if room < 8:
        raise ValueError(f"--max-tokens {max_tokens} leaves no room for a prompt in max_model_len {max_model_len}")
    long_tokens = min(4 * prompt_tokens, LONG_CAP.get(device, LONG_CAP["cuda"]), room)
    targets: dict[str, int] = {}
    for item in mix:
        if item == "short":
            continue
        if item == "medium":
            targets[item] = min(prompt_tokens, room)
        elif item == "long":
            targets[item] = long_tokens
        elif item.isdigit():
            targets[item] = min(int(item), room)
        else:
            raise ValueError(f"prompt mix item {item!r}: use short, medium, long or a token count")
    shapes: dict[str, dict[str, int]] = {}
    timeout = httpx.Timeout(30.0)
    async with httpx.AsyncClient(timeout=timeout) as client:
        per_word = await tokens_per_word(client, base_url, model, api_key) if targets else 0.0
        for item in mix:
            if item == "short":
                shapes[item] = {"words": SHORT_WORDS, "tokens": 0}
                continue
            words, tokens = sized_prompt(targets[item], per_word)
            shapes[item] = {"words": words, "tokens": tokens}
        if "short" in shapes:
            shapes["short"]["tokens"] = await count_tokens(client, base_url, model, prompt_of(SHORT_WORDS), api_key)
    return shapes


def _as_words(prompt_words: int | Sequence[int]) -> list[int]:
    words = [prompt_words] if isinstance(prompt_words, int) else list(prompt_words)
    if not words or min(words) < 1:
        raise ValueError("prompt_words: one or more word counts, each at least 1")
    return words


# -- one level ----------------------------------------------------------------------------
async def _closed_loop(
    concurrency: int,
    n_requests: int,
    one: Callable[[int, int], Any],
    time_cap_s: float,
    drain_s: float,
) -> tuple[list[ChatResult], float, int]:
    """``concurrency`` workers take request numbers until ``n_requests`` or the cap.

    ``one(worker, i)`` returns a ChatResult. Returns (results, wall seconds, cut-off count).
    """
    results: list[ChatResult] = []
    next_i = 0
    t0 = time.perf_counter()
    deadline = t0 + time_cap_s
    last_end = t0

    async def worker(w: int) -> None:
        nonlocal next_i, last_end
        while next_i < n_requests and time.perf_counter() < deadline:
            i = next_i
            next_i += 1
            res = await one(w, i)
            results.append(res)
            last_end = time.perf_counter()

    tasks = [asyncio.create_task(worker(w)) for w in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=time_cap_s + drain_s)
    wall = (time.perf_counter() if pending else last_end) - t0
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and (err := task.exception()) is not None:
            raise err
    return results, wall, len(pending)


async def _direct_span(
    base_url: str,
    model: str,
    concurrency: int,
    n_requests: int,
    *,
    max_tokens: int,
    words: list[int],
    api_key: str | None,
    keepalive: bool,
    time_cap_s: float,
    drain_s: float,
) -> Span:
    limits = httpx.Limits(
        max_connections=max(100, concurrency),
        max_keepalive_connections=max(20, concurrency) if keepalive else 0,
    )
    read = time_cap_s + drain_s
    timeout = httpx.Timeout(connect=10.0, read=read, write=30.0, pool=read)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def one(_worker: int, i: int) -> ChatResult:
            return await ask(
                client, base_url, model, prompt_of(words[i % len(words)]), max_tokens=max_tokens, api_key=api_key
            )

        cpu0, t0 = time.process_time(), time.perf_counter()
        results, wall, cut = await _closed_loop(concurrency, n_requests, one, time_cap_s, drain_s)
    return Span(results, t0, t0 + wall, cut, time.process_time() - cpu0)


def direct_span(job: dict[str, Any]) -> Span:
    """One client process's share of a level (module level: a spawned process imports it)."""
    return asyncio.run(_direct_span(**job))


async def measure_level(
    base_url: str,
    model: str,
    concurrency: int,
    n_requests: int,
    *,
    max_tokens: int,
    prompt_words: int | Sequence[int],
    api_key: str | None,
    keepalive: bool,
    time_cap_s: float = LEVEL_TIME_CAP_S,
    drain_s: float = DRAIN_S,
    processes: int | None = None,
) -> dict[str, Any]:
    """One level straight to vLLM: ``n_requests`` streamed chats, ``concurrency`` at a time.

    Request i gets a fresh prompt of ``prompt_words[i % len]`` words and exactly ``max_tokens``
    reply tokens (``ignore_eos``). ``keepalive`` False: a new connection per request
    (``max_keepalive_connections=0``, as the chat page does by default); True: pooled
    connections, the pool sized so it never queues a request. ``processes``: client processes
    that share the load (default: ``loadgen.client_processes``, 1 on small machines).
    """
    if concurrency < 1 or n_requests < 1:
        raise ValueError("concurrency and n_requests must be at least 1")
    job: dict[str, Any] = {
        "base_url": base_url,
        "model": model,
        "max_tokens": max_tokens,
        "words": _as_words(prompt_words),
        "api_key": api_key,
        "keepalive": keepalive,
        "time_cap_s": time_cap_s,
        "drain_s": drain_s,
    }
    procs = min(processes or client_processes(concurrency), concurrency, n_requests)
    if procs <= 1:
        span = await _direct_span(concurrency=concurrency, n_requests=n_requests, **job)
    else:
        jobs = [
            {**job, "concurrency": c, "n_requests": n}
            for c, n in zip(split(concurrency, procs), split(n_requests, procs), strict=True)
        ]
        span = merge(await asyncio.to_thread(fan_out, direct_span, jobs, time_cap_s + drain_s))
    out = summarize(
        span.results, concurrency=concurrency, planned=n_requests, wall_s=span.end - span.start, cut_off=span.cut_off
    )
    out["short_replies"] = sum(1 for r in span.results if r.ok and r.tokens < max_tokens)
    out["client_processes"] = procs
    out["client_busy"] = round(span.busy, 3)
    return out


async def measure_page_level(
    page_url: str,
    concurrency: int,
    n_requests: int,
    *,
    max_tokens: int,
    prompt_words: int | Sequence[int],
    time_cap_s: float = LEVEL_TIME_CAP_S,
    drain_s: float = DRAIN_S,
    cookie: str | None = None,
) -> dict[str, Any]:
    """One level through the chat page: ``concurrency`` browser tabs, the same prompt shapes.

    Every request is the first message of a new chat (a fresh tab), so it carries no history
    and its prompt matches the direct path's. The tab is opened (and its chat settings set:
    ``max_tokens``, temperature 0) before the clock of its request starts; opening counts in
    the level's wall time (tokens/s, requests/s) but not in TTFT. The page cannot ask for
    ``ignore_eos``, so replies may end early (``short_replies``).
    """
    from backend.measure.page_client import PageError, PageSession

    words = _as_words(prompt_words)

    async def one(_worker: int, i: int) -> ChatResult:
        try:
            tab = PageSession(page_url, cookie=cookie)
        except PageError as err:  # python-socketio missing
            return ChatResult(error=str(err))
        try:
            await tab.connect()
            await tab.set_settings(max_tokens=max_tokens, temperature=0.0)
            return await tab.ask(prompt_of(words[i % len(words)]), timeout=time_cap_s + drain_s)
        except PageError as err:
            return ChatResult(error=str(err))
        finally:
            await tab.close()

    results, wall, cut = await _closed_loop(concurrency, n_requests, one, time_cap_s, drain_s)
    out = summarize(results, concurrency=concurrency, planned=n_requests, wall_s=wall, cut_off=cut)
    out["short_replies"] = sum(1 for r in results if r.ok and r.tokens < max_tokens)
    return out


# -- a whole run --------------------------------------------------------------------------
async def engine_info(base_url: str, model: str, api_key: str | None) -> dict[str, Any]:
    """vLLM's version and the served model's max_model_len; raises httpx.HTTPError when unreachable."""
    info: dict[str, Any] = {"version": None, "max_model_len": None}
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
        r = await client.get(f"{base_url.rstrip('/')}/models", headers=headers(api_key))
        r.raise_for_status()
        models = r.json().get("data", [])
        listed = [m for m in models if m.get("id") == model]
        if not listed:
            names = ", ".join(m.get("id", "?") for m in models) or "none"
            raise ValueError(f"the engine at {base_url} does not serve '{model}' (it serves: {names}); use --model")
        info["max_model_len"] = listed[0].get("max_model_len")
        try:
            v = await client.get(f"{root_url(base_url)}/version")
            if v.status_code == 200:
                info["version"] = v.json().get("version")
        except (httpx.HTTPError, ValueError):
            pass
    return info


def variant_name(path: str, keepalive: bool | None) -> str:
    return path if keepalive is None else f"{path} keep-alive {'on' if keepalive else 'off'}"


def bench_engine(
    base_url: str,
    model: str,
    *,
    levels: Sequence[int] = DEFAULT_LEVELS,
    requests_per_level: int | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    prompt_mix: Sequence[str] = DEFAULT_MIX,
    prompt_tokens: int = 512,
    api_key: str | None = None,
    keepalive: str = "on",
    page_url: str | None = None,
    page_keepalive: bool = False,
    time_cap_s: float = LEVEL_TIME_CAP_S,
    device: str = "cuda",
    processes: int | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every level on every path; the report that ``bench.json`` holds (without files).

    ``page_keepalive``: whether the page talks to the engine with keep-alive (``app.keepalive``);
    the page's added TTFT is taken against the direct variant that matches it when measured.
    """
    if keepalive not in KEEPALIVE_VARIANTS:
        raise ValueError(f"keepalive={keepalive!r}: use on, off or both")
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    info = asyncio.run(engine_info(base_url, model, api_key))
    shapes = asyncio.run(
        prompt_shapes(
            base_url,
            model,
            prompt_mix,
            api_key=api_key,
            max_tokens=max_tokens,
            prompt_tokens=prompt_tokens,
            max_model_len=info["max_model_len"],
            device=device,
        )
    )
    words = [shapes[item]["words"] for item in prompt_mix]
    say(
        "prompts: "
        + ", ".join(f"{item} ~{shapes[item]['tokens']} tokens" for item in prompt_mix)
        + f"; replies {max_tokens} tokens"
    )
    results: list[dict[str, Any]] = []
    variants: list[tuple[str, bool | None]] = [("direct", ka) for ka in KEEPALIVE_VARIANTS[keepalive]]
    if page_url:
        variants.append(("page", None))
    for level in levels:
        n = requests_for(level, requests_per_level)
        for path, ka in variants:
            name = variant_name(path, ka)
            lt0 = time.perf_counter()
            if path == "direct":
                row = asyncio.run(
                    measure_level(
                        base_url,
                        model,
                        level,
                        n,
                        max_tokens=max_tokens,
                        prompt_words=words,
                        api_key=api_key,
                        keepalive=bool(ka),
                        time_cap_s=time_cap_s,
                        processes=processes,
                    )
                )
            else:
                assert page_url is not None
                row = asyncio.run(
                    measure_page_level(
                        page_url, level, n, max_tokens=max_tokens, prompt_words=words, time_cap_s=time_cap_s
                    )
                )
            row = {"path": path, "variant": name, "keepalive": ka, **row}
            results.append(row)
            say(f"  {name:22} c={level:<4} {n:4} requests in {time.perf_counter() - lt0:6.1f} s  {_brief(row)}")
    added = page_added_ttft(results, page_keepalive)
    return {
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - t0, 1),
        "engine": {"base_url": base_url, "model": model, **info},
        "client": {"host": platform.node(), "python": platform.python_version()},
        "config": {
            "levels": list(levels),
            "requests_per_level": {str(c): requests_for(c, requests_per_level) for c in levels},
            "max_tokens": max_tokens,
            "prompt_mix": {item: shapes[item] for item in prompt_mix},
            "keepalive": keepalive,
            "page": page_url,
            "time_cap_s": time_cap_s,
            "ignore_eos": True,
        },
        "results": results,
        "page_added_ttft_ms": added,
    }


def page_added_ttft(results: Sequence[dict[str, Any]], page_keepalive: bool = False) -> dict[str, float | None]:
    """Per level: page p50 TTFT − direct p50 TTFT (the direct variant matching the page's keep-alive)."""
    added: dict[str, float | None] = {}
    pages = {r["concurrency"]: r for r in results if r["path"] == "page"}
    for c, page in pages.items():
        direct = [r for r in results if r["path"] == "direct" and r["concurrency"] == c]
        match = [r for r in direct if r["keepalive"] == page_keepalive] or direct
        if not match or page["ttft_p50_ms"] is None or match[0]["ttft_p50_ms"] is None:
            added[str(c)] = None
            continue
        added[str(c)] = round(page["ttft_p50_ms"] - match[0]["ttft_p50_ms"], 2)
    return added


CLIENT_BUSY_WARN = 0.8
"""A client process on the CPU this share of the time may be what limits tokens/s."""


def client_note(row: dict[str, Any]) -> str:
    """' (client busy 91 %: a floor)' when the load generator may have been the limit, else ''."""
    busy = row.get("client_busy") or 0.0
    return f" (client busy {busy:.0%}: a floor)" if busy >= CLIENT_BUSY_WARN else ""


def _brief(row: dict[str, Any]) -> str:
    ttft = row["ttft_p50_ms"]
    return (
        f"TTFT p50 {ttft:.0f} ms, {row['output_tokens_per_s']:.0f} tok/s, {row['errors']} errors{client_note(row)}"
        if ttft is not None
        else f"no successful request; {row['errors']} errors {row['error_samples'][:1]}"
    )


# -- output -------------------------------------------------------------------------------
def _f(v: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


def table(report: dict[str, Any]) -> str:
    head = (
        f"{'path':22} {'conc':>4} {'ok':>4} {'err':>3}  {'TTFT p50/p99 ms':>16}  {'ITL p50/p99/max ms':>22}  "
        f"{'TPOT p50/p99 ms':>15}  {'E2E p50/p99 s':>14}  {'tok/s':>8} {'req/s':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in sorted(report["results"], key=lambda r: (r["concurrency"], r["variant"])):
        lines.append(
            f"{r['variant']:22} {r['concurrency']:>4} {r['ok']:>4} {r['errors']:>3}  "
            f"{_f(r['ttft_p50_ms']) + ' / ' + _f(r['ttft_p99_ms']):>16}  "
            f"{' / '.join(_f(r.get(k), digits=1) for k in ('itl_p50_ms', 'itl_p99_ms', 'itl_max_ms')):>22}  "
            f"{_f(r['tpot_p50_ms'], digits=1) + ' / ' + _f(r['tpot_p99_ms'], digits=1):>15}  "
            f"{_f(r['e2e_p50_ms'], 0.001, 2) + ' / ' + _f(r['e2e_p99_ms'], 0.001, 2):>14}  "
            f"{r['output_tokens_per_s']:>8.1f} {r['requests_per_s']:>6.2f}"
        )
    for c, ms in report.get("page_added_ttft_ms", {}).items():
        lines.append(f"page added TTFT at c={c}: {_f(ms)} ms (page p50 − direct p50)")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> str | None:
    """bench.png; returns a note instead when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: bench.png skipped (pip install matplotlib)"
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(12, 4.8))
    variants = sorted({r["variant"] for r in report["results"]})
    for i, name in enumerate(variants):
        rows = sorted((r for r in report["results"] if r["variant"] == name), key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in rows]
        color = f"C{i}"
        ax_t.plot(xs, [r["ttft_p50_ms"] for r in rows], "o-", color=color, label=f"{name} p50")
        ax_t.plot(xs, [r["ttft_p99_ms"] for r in rows], "s--", color=color, label=f"{name} p99")
        ax_r.plot(xs, [r["output_tokens_per_s"] for r in rows], "o-", color=color, label=name)
    levels = report["config"]["levels"]
    for ax, title, ylabel in (
        (ax_t, "Time to first token", "TTFT (ms)"),
        (ax_r, "Output throughput", "output tokens/s"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    eng = report["engine"]
    label = report.get("label") or ""
    fig.suptitle(
        f"{eng['model']} on {report.get('hardware', '?')} — {report.get('plan', {}).get('summary', '')}"
        + (f" — {label}" if label else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path | None]:
    """bench.json and bench.png in ``out``; the PNG is None (with a note in the report) without matplotlib."""
    out.mkdir(parents=True, exist_ok=True)
    png: Path | None = out / "bench.png"
    note = plot(report, png)  # type: ignore[arg-type]
    if note:
        report.setdefault("notes", []).append(note)
        png = None
    json_path = out / "bench.json"
    json_path.write_text(json.dumps(report, indent=2))
    return json_path, png


# -- the command --------------------------------------------------------------------------
def this_machine() -> str:
    try:
        from config.hardware import detect

        return detect().name
    except Exception:  # detection is informative here, never a reason to fail a bench
        return platform.node()
