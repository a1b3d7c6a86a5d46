"""``bench``: load a running engine at several concurrencies and say what it delivers.

Straight to vLLM and, with ``--page``, through the Chainlit page's socket with prompts of the
same shapes, so the page's own cost shows as added first-token time (one level of either:
``levels``). Output: a table on stdout, ``bench.json`` (all numbers, hardware, plan, engine
version, timestamps) and ``bench.png`` (TTFT p50/p99 and tokens/s against concurrency;
skipped with a note when matplotlib is missing).
"""

from __future__ import annotations

import asyncio
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import BaseModel, Field

from backend.engine_api import models, root_url
from backend.errors import UsageError
from backend.measure.expected import LevelCheck, expected_table
from backend.measure.levels import LEVEL_TIME_CAP_S, Load, Target, measure_level, measure_page_level
from backend.measure.stats import Level
from backend.prompts import prompt_shapes

DEFAULT_LEVELS = (1, 4, 16, 64)
DEFAULT_MAX_TOKENS = 128
DEFAULT_MIX = ("short", "medium", "long")
KEEPALIVE_VARIANTS = {"on": (True,), "off": (False,), "both": (True, False)}
CLIENT_BUSY_WARN = 0.8
"""A client process on the CPU this share of the time may be what limits tokens/s."""


# -- levels ---------------------------------------------------------------------------------
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


def variant_name(path: str, keepalive: bool | None) -> str:
    return path if keepalive is None else f"{path} keep-alive {'on' if keepalive else 'off'}"


# -- records --------------------------------------------------------------------------------
class BenchRow(Level):
    """One level on one path: 'direct' (keep-alive on or off) or 'page' (keepalive None); ``setup``: which
    of two compared setups (``bench --compare``), empty when one is measured."""

    path: str
    keepalive: bool | None = None
    setup: str = ""
    expected: LevelCheck | None = None
    """The performance model's prediction for this level and its error (``expected``)."""

    @property
    def variant(self) -> str:
        name = variant_name(self.path, self.keepalive)
        return f"{self.setup}: {name}" if self.setup else name

    def json_shape(self, data: dict[str, Any]) -> dict[str, Any]:
        data = super().json_shape(data)
        head = {"path": data.pop("path"), "variant": self.variant, "keepalive": data.pop("keepalive")}
        setup = data.pop("setup")
        if data.get("expected") is None:
            data.pop("expected", None)
        return {**({"setup": setup} if setup else {}), **head, **data}

    @classmethod
    def of(cls, level: Level, path: str, keepalive: bool | None, setup: str = "") -> BenchRow:
        return cls(path=path, keepalive=keepalive, setup=setup, **dict(level))


class BenchReport(BaseModel):
    """What ``bench.json`` holds; the command adds the context (label, hardware, plan, notes)."""

    started_at: str
    finished_at: str
    duration_s: float
    engine: dict[str, Any]
    """base_url, model, and vLLM's version and max_model_len as the engine reports them."""
    client: dict[str, str]
    config: dict[str, Any]
    results: list[BenchRow]
    page_added_ttft_ms: dict[str, float | None]
    setups: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """``bench --compare``: each setup's engine URL, served name and plan, by its name."""
    compared: list[dict[str, Any]] = Field(default_factory=list)
    """``bench --compare``: per level, each compared setup's p50 TTFT, TPOT and tokens/s over the first's."""
    label: str = ""
    hardware: str | None = None
    plan: dict[str, Any] = Field(default_factory=dict)
    demo: bool | None = None
    warmup: dict[str, Any] | None = None
    notes: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class BenchOptions:
    """What a bench run measures (the ``bench`` command's flags and the engine's context).

    ``page_keepalive``: whether the page talks to the engine with keep-alive (``app.keepalive``);
    the page's added TTFT is taken against the direct variant that matches it when measured.
    """

    levels: tuple[int, ...] = DEFAULT_LEVELS
    requests_per_level: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    prompt_mix: tuple[str, ...] = DEFAULT_MIX
    prompt_tokens: int = 512
    keepalive: str = "on"
    page_url: str | None = None
    page_keepalive: bool = False
    time_cap_s: float = LEVEL_TIME_CAP_S
    device: str = "cuda"
    processes: int | None = None


# -- a whole run ----------------------------------------------------------------------------
async def engine_info(target: Target) -> dict[str, Any]:
    """vLLM's version and the served model's max_model_len; raises httpx.HTTPError when unreachable."""
    info: dict[str, Any] = {"version": None, "max_model_len": None}
    base_url = target.base_url
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
        served = await models(client, base_url, target.api_key)
        listed = [m for m in served if m.id == target.model]
        if not listed:
            names = ", ".join(m.id for m in served) or "none"
            raise UsageError(
                f"the engine at {base_url} does not serve '{target.model}' (it serves: {names}); use --model"
            )
        info["max_model_len"] = listed[0].max_model_len
        try:
            v = await client.get(f"{root_url(base_url)}/version")
            if v.status_code == 200:
                info["version"] = v.json().get("version")
        except (httpx.HTTPError, ValueError):
            pass
    return info


def bench_engine(
    target: Target,
    options: BenchOptions,
    say: Callable[[str], None] = print,
    setups: Sequence[tuple[str, Target]] = (),
) -> BenchReport:
    """Every level on every path; the report that ``bench.json`` holds (without files). ``setups``: two
    compared setups (``bench --compare``, the first ``target``'s own), measured level by level in turn,
    the first of them alternating, never at once."""
    o = options
    if setups and o.page_url:
        raise UsageError(
            "--compare with --page: the page answers every message with both setups, one after the other; "
            "measure the setups direct (without --page)"
        )
    if o.keepalive not in KEEPALIVE_VARIANTS:
        raise UsageError(f"keepalive={o.keepalive!r}: use on, off or both")
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    info = asyncio.run(engine_info(target))
    shapes = asyncio.run(
        prompt_shapes(
            target.base_url,
            target.model,
            o.prompt_mix,
            api_key=target.api_key,
            max_tokens=o.max_tokens,
            prompt_tokens=o.prompt_tokens,
            max_model_len=info["max_model_len"],
            device=o.device,
        )
    )
    say(
        "prompts: "
        + ", ".join(f"{item} ~{shapes[item].tokens} tokens" for item in o.prompt_mix)
        + f"; replies {o.max_tokens} tokens"
    )
    words = tuple(shapes[item].words for item in o.prompt_mix)
    load = Load(o.max_tokens, words, time_cap_s=o.time_cap_s, processes=o.processes)
    variants: list[tuple[str, bool | None]] = [("direct", ka) for ka in KEEPALIVE_VARIANTS[o.keepalive]]
    if o.page_url:
        variants.append(("page", None))
    results: list[BenchRow] = []
    measured = list(setups) or [("", target)]
    for i, concurrency in enumerate(o.levels):
        n = requests_for(concurrency, o.requests_per_level)
        for setup, aimed in measured if i % 2 == 0 else measured[::-1]:
            for path, ka in variants:
                lt0 = time.perf_counter()
                level = _one_level(aimed, o.page_url, path, ka, concurrency, n, load)
                row = BenchRow.of(level, path, ka, setup)
                results.append(row)
                took = time.perf_counter() - lt0
                say(f"  {row.variant:22} c={concurrency:<4} {n:4} requests in {took:6.1f} s  {brief(row)}")
    return BenchReport(
        started_at=started.isoformat(timespec="seconds"),
        finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
        duration_s=round(time.perf_counter() - t0, 1),
        engine={"base_url": target.base_url, "model": target.model, **info},
        client={"host": platform.node(), "python": platform.python_version()},
        config={
            "levels": list(o.levels),
            "requests_per_level": {str(c): requests_for(c, o.requests_per_level) for c in o.levels},
            "max_tokens": o.max_tokens,
            "prompt_mix": {item: shapes[item].model_dump() for item in o.prompt_mix},
            "keepalive": o.keepalive,
            "page": o.page_url,
            "time_cap_s": o.time_cap_s,
            "ignore_eos": True,
        },
        results=results,
        page_added_ttft_ms=page_added_ttft(results, o.page_keepalive),
        compared=compared_levels(results),
    )


def compared_levels(results: Sequence[BenchRow]) -> list[dict[str, Any]]:
    """Per level and variant, each compared setup's p50 TTFT, p50 TPOT and tokens/s over the first
    setup's (``bench --compare``); empty when one setup was measured."""
    names = list(dict.fromkeys(r.setup for r in results if r.setup))
    out: list[dict[str, Any]] = []
    for c in dict.fromkeys(r.concurrency for r in results):
        for path, ka in dict.fromkeys((r.path, r.keepalive) for r in results):
            rows = {r.setup: r for r in results if (r.concurrency, r.path, r.keepalive) == (c, path, ka)}
            base = rows.get(names[0]) if names else None
            for name in names[1:]:
                other = rows.get(name)
                if base is None or other is None:
                    continue
                out.append(
                    {
                        "concurrency": c,
                        "variant": variant_name(path, ka),
                        "setup": name,
                        "over": names[0],
                        "ttft_p50": _over(other.ttft_p50_ms, base.ttft_p50_ms),
                        "tpot_p50": _over(other.tpot_p50_ms, base.tpot_p50_ms),
                        "output_tokens_per_s": _over(other.output_tokens_per_s, base.output_tokens_per_s),
                    }
                )
    return out


def _over(value: float | None, base: float | None) -> float | None:
    return round(value / base, 3) if value is not None and base else None


def _one_level(
    target: Target, page_url: str | None, path: str, keepalive: bool | None, concurrency: int, n: int, load: Load
) -> Level:
    if path == "page":
        assert page_url is not None
        return asyncio.run(measure_page_level(page_url, concurrency, n, load))
    return asyncio.run(measure_level(target, concurrency, n, replace(load, keepalive=bool(keepalive))))


def page_added_ttft(results: Sequence[BenchRow], page_keepalive: bool = False) -> dict[str, float | None]:
    """Per level: page p50 TTFT − direct p50 TTFT (the direct variant matching the page's keep-alive)."""
    added: dict[str, float | None] = {}
    pages = {r.concurrency: r for r in results if r.path == "page"}
    for c, page in pages.items():
        direct = [r for r in results if r.path == "direct" and r.concurrency == c]
        match = [r for r in direct if r.keepalive == page_keepalive] or direct
        if not match or page.ttft_p50_ms is None or match[0].ttft_p50_ms is None:
            added[str(c)] = None
            continue
        added[str(c)] = round(page.ttft_p50_ms - match[0].ttft_p50_ms, 2)
    return added


# -- output ---------------------------------------------------------------------------------
def client_note(level: Level) -> str:
    """' (client busy 91 %: a floor)' when the load generator may have been the limit, else ''."""
    busy = level.client_busy or 0.0
    return f" (client busy {busy:.0%}: a floor)" if busy >= CLIENT_BUSY_WARN else ""


def brief(level: Level) -> str:
    ttft = level.ttft_p50_ms
    return (
        f"TTFT p50 {ttft:.0f} ms, {level.output_tokens_per_s:.0f} tok/s, {level.errors} errors{client_note(level)}"
        if ttft is not None
        else f"no successful request; {level.errors} errors {level.error_samples[:1]}"
    )


def _f(v: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


def table(report: BenchReport) -> str:
    w = max([22, *(len(r.variant) for r in report.results)])
    head = (
        f"{'path':{w}} {'conc':>4} {'ok':>4} {'err':>3}  {'TTFT p50/p99 ms':>16}  {'ITL p50/p99/max ms':>22}  "
        f"{'TPOT p50/p99 ms':>15}  {'E2E p50/p99 s':>14}  {'tok/s':>8} {'req/s':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in sorted(report.results, key=lambda r: (r.concurrency, r.variant)):
        lines.append(
            f"{r.variant:{w}} {r.concurrency:>4} {r.ok:>4} {r.errors:>3}  "
            f"{_f(r.ttft_p50_ms) + ' / ' + _f(r.ttft_p99_ms):>16}  "
            f"{' / '.join(_f(v, digits=1) for v in (r.itl_p50_ms, r.itl_p99_ms, r.itl_max_ms)):>22}  "
            f"{_f(r.tpot_p50_ms, digits=1) + ' / ' + _f(r.tpot_p99_ms, digits=1):>15}  "
            f"{_f(r.e2e_p50_ms, 0.001, 2) + ' / ' + _f(r.e2e_p99_ms, 0.001, 2):>14}  "
            f"{r.output_tokens_per_s:>8.1f} {r.requests_per_s:>6.2f}"
        )
    for c, added in report.page_added_ttft_ms.items():
        lines.append(f"page added TTFT at c={c}: {_f(added)} ms (page p50 − direct p50)")
    for line in report.compared:
        lines.append(
            f"c={line['concurrency']} {line['variant']}: {line['setup']} ÷ {line['over']}: TTFT p50 "
            f"{_f(line['ttft_p50'], digits=2)}x, TPOT p50 {_f(line['tpot_p50'], digits=2)}x, "
            f"tok/s {_f(line['output_tokens_per_s'], digits=2)}x"
        )
    if expected := expected_table(report.results):
        lines += ["", expected]
    return "\n".join(lines)


def this_machine() -> str:
    try:
        from config.hardware import detect

        return detect().name
    except Exception:  # detection is informative here, never a reason to fail a bench
        return platform.node()
