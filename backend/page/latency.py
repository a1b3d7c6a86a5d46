"""Each reply's latency as one row, and the ``/latency`` panel made from a series of them.

A row is a plain JSON-able dict kept in the reply message's ``metadata["timing"]``, so the panel
is rebuilt from a chat's stored messages as well as from a live one. It splits the first-token
time the user waited into the page's own share (from Chainlit's receipt of the message to the
request leaving), the way to the engine and back (router, HTTP, vLLM's API server), the
engine's queue and its prefill; the last two only where vLLM reports them
(``--enable-per-request-metrics``), else they are None and the footer says so.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from backend.engine_api import ChatResult
from backend.measure.plots import setup_of
from backend.measure.stats import percentile, ratio_of_medians, tpot_s
from config.compare import PLAN_LABEL as PLAN
from config.performance.forecast import Forecast
from config.performance.prediction import Load
from config.performance.text import figure, number, signed
from config.plan import Plan

TIMING_KEY = "timing"
"""Where a reply message's metadata keeps its row."""
COLUMNS = (
    "reply",
    "chat",
    "setup",
    "at",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "ttft_ms",
    "page_ms",
    "http_ms",
    "queue_ms",
    "prefill_ms",
    "itl_p50_ms",
    "tpot_ms",
    "decode_tok_s",
    "e2e_ms",
    "finish_reason",
    "first_after_start",
)
"""One row per reply, in this order in the panel, the CSV and the JSON."""
SUMMARISED = (("ttft_ms", "TTFT (ms)"), ("itl_p50_ms", "inter-token gap p50 (ms)"), ("decode_tok_s", "decode tok/s"))
QUANTILES = (50, 90, 99)
PANEL_ROWS = 30
"""The panel's table shows the latest replies; the CSV and JSON hold them all."""
NOT_REPORTED = "queue/prefill: not reported by this vLLM"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def token_gap_p50_ms(result: ChatResult) -> float | None:
    """Median gap between streamed chunks, per token: a chunk of several tokens (vLLM's
    ``--stream-interval``) counts as that many gaps of its share."""
    gaps = result.itl_s
    if not gaps:
        return None
    per_chunk = result.tokens / result.deltas if result.deltas and result.tokens > result.deltas else 1.0
    return round(statistics.median(gaps) * 1000 / per_chunk, 2)


def timing_row(
    result: ChatResult,
    *,
    reply: int,
    chat: str,
    first_after_start: bool,
    stopped: bool = False,
    setup: str = PLAN,
) -> dict[str, Any]:
    """One reply's row (ms, tokens, local time of day); parts the engine did not report are None.
    ``setup``: which of two compared setups answered (``up --compare``), else the plan."""
    metrics = result.engine_metrics
    queue, prefill = metrics.get("queue_time_ms"), metrics.get("time_to_first_token_ms")
    engine = None if result.ttft_s is None else max(result.ttft_s - result.sent_s, 0.0) * 1000
    http = None
    if engine is not None and queue is not None and prefill is not None:
        http = max(engine - queue - prefill, 0.0)
    return {
        "reply": reply,
        "chat": chat,
        "setup": setup,
        "at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "output_tokens": result.tokens,
        "ttft_ms": _ms(result.ttft_s),
        "page_ms": _ms(result.sent_s),
        "http_ms": None if http is None else round(http, 1),
        "queue_ms": None if queue is None else round(queue, 1),
        "prefill_ms": None if prefill is None else round(prefill, 1),
        "itl_p50_ms": token_gap_p50_ms(result),
        "tpot_ms": _ms(tpot_s(result)),
        "decode_tok_s": round(result.tokens_per_s, 1),
        "e2e_ms": _ms(result.total_s),
        "finish_reason": "stopped" if stopped else result.finish_reason,
        "first_after_start": first_after_start,
    }


def split_line(row: Mapping[str, Any]) -> str:
    """The footer's second half: the first token's parts and the time of day, e.g.
    ``queue 0 ms · prefill 41 ms (0 of 24 prompt tokens cached) · HTTP 3 ms · page 2 ms · 14:03:22``."""

    def ms(key: str) -> str:
        return f"{row[key]:.0f} ms"

    prompt, cached = row.get("prompt_tokens"), row.get("cached_tokens")
    if cached is not None and prompt is not None:
        cache = f"{cached} of {prompt} prompt tokens cached"
    else:
        cache = "cached prompt tokens: not reported by this vLLM"
    if row.get("queue_ms") is not None and row.get("prefill_ms") is not None:
        parts = [f"queue {ms('queue_ms')}", f"prefill {ms('prefill_ms')} ({cache})"]
        if row.get("http_ms") is not None:
            parts.append(f"HTTP {ms('http_ms')}")
    else:
        parts = [NOT_REPORTED, cache]
    if row.get("page_ms") is not None:
        parts.append(f"page {ms('page_ms')}")
    parts.append(str(row.get("at", ""))[-8:])
    return " · ".join(parts)


# -- a series of rows --------------------------------------------------------------------------
def rows_of(metadatas: Iterable[Any]) -> list[dict[str, Any]]:
    """The rows kept in messages' metadata, in order; metadata read back from a database may be
    a JSON string."""
    rows = []
    for meta in metadatas:
        if isinstance(meta, str):
            try:
                meta = json.loads(meta)
            except ValueError:
                continue
        row = meta.get(TIMING_KEY) if isinstance(meta, dict) else None
        if isinstance(row, dict):
            rows.append(row)
    return rows


def since(rows: list[dict[str, Any]], start: str | None) -> list[dict[str, Any]]:
    """The rows of the series begun at ``start`` (a row's ``at``; None: all of them)."""
    return rows if start is None else [r for r in rows if str(r.get("at", "")) >= start]


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Count, min, p50, p90, p99 and max of TTFT, inter-token gap and decode tok/s."""
    out = []
    for key, label in SUMMARISED:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        line: dict[str, Any] = {"figure": label, "count": len(values), "min": min(values, default=None)}
        for q in QUANTILES:
            p = percentile(values, q)
            line[f"p{q}"] = None if p is None else round(p, 1)
        line["max"] = max(values, default=None)
        out.append(line)
    return out


COMPARED = (
    ("ttft_ms", "TTFT (ms)"),
    ("page_ms", "TTFT: page (ms)"),
    ("http_ms", "TTFT: HTTP (ms)"),
    ("queue_ms", "TTFT: queue (ms)"),
    ("prefill_ms", "TTFT: prefill (ms)"),
    ("tpot_ms", "TPOT (ms)"),
    ("decode_tok_s", "decode tok/s"),
)
"""The figures two setups are compared by (``up --compare``): the first token, its parts, then decoding."""


def setups_of(rows: list[dict[str, Any]]) -> list[str]:
    """The setups that answered, the plan first, the others in the order they first answered."""
    names = list(dict.fromkeys(setup_of(r) for r in rows))
    return sorted(names, key=lambda name: name != PLAN)


def _values(rows: list[dict[str, Any]], key: str, setup: str | None = None) -> list[float]:
    mine = rows if setup is None else [r for r in rows if setup_of(r) == setup]
    return [float(r[key]) for r in mine if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def comparison(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per figure: each setup's p50, p90 and p99, and for each setup after the first the ratio of its
    median to the first's with the spread of that ratio (``stats.ratio_of_medians``)."""
    names = setups_of(rows)
    out = []
    for key, label in COMPARED:
        line: dict[str, Any] = {"figure": label}
        series = {name: _values(rows, key, name) for name in names}
        for name in names:
            for q in QUANTILES:
                p = percentile(series[name], q)
                line[f"{name} p{q}"] = None if p is None else round(p, 1)
        for name in names[1:]:
            line[f"{name} ratio"] = ratio_of_medians(series[names[0]], series[name])
        out.append(line)
    return out


def comparison_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The comparison as a table: percentiles per setup, then each ratio of medians and its 90% interval."""
    names = setups_of(rows)
    head = ["figure", *(f"{name} p{q}" for name in names for q in QUANTILES)]
    head += [f"{name} ÷ {names[0]} (p50)" for name in names[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for line in comparison(rows):
        cells = [line["figure"], *(_cell(line[f"{name} p{q}"]) for name in names for q in QUANTILES)]
        for name in names[1:]:
            ratio = line[f"{name} ratio"]
            cells.append("–" if ratio is None else f"{ratio[0]:.2f} ({ratio[1]:.2f}-{ratio[2]:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    counts = ", ".join(f"{name} {len([r for r in rows if setup_of(r) == name])}" for name in names)
    lines += [
        "",
        f"_Replies per setup: {counts}. The ratio is one setup's median over {names[0]}'s, under 1 faster "
        "for times, slower for tok/s; in brackets the 5th-95th percentile of that ratio over 1,000 resamples "
        "of both series._",
    ]
    return lines


def to_csv(rows: list[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if r.get(k) is None else r.get(k) for k in COLUMNS} for r in rows)
    return buf.getvalue().encode()


def to_json(rows: list[dict[str, Any]]) -> bytes:
    return json.dumps([{k: r.get(k) for k in COLUMNS} for r in rows], indent=1).encode()


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value).replace("|", "/")


def panel_markdown(rows: list[dict[str, Any]], title: str) -> str:
    """The summary, then the latest replies as a table."""
    if not rows:
        return f"**{title}:** no replies yet. Send messages, then `/latency` again."
    lines = [f"**{title}:** {len(rows)} repl{'ies' if len(rows) > 1 else 'y'}", ""]
    several = len(setups_of(rows)) > 1
    if several:
        lines += comparison_markdown(rows)
    else:
        stats = summary(rows)
        head = ["figure", "count", "min", *(f"p{q}" for q in QUANTILES), "max"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(_cell(s[h]) for h in head) + " |" for s in stats]
    shown = rows[-PANEL_ROWS:]
    kept = {"chat": len({r.get("chat") for r in rows}) > 1, "setup": several}
    cols = [c for c in COLUMNS if kept.get(c, True)]
    lines += ["", f"Latest {len(shown)} of {len(rows)} (the CSV and JSON hold all):" if len(shown) < len(rows) else ""]
    lines += ["| " + " | ".join(c.replace("_", " ") for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in shown:
        at = dict(r, at=str(r.get("at", ""))[-8:])
        lines.append("| " + " | ".join(_cell(at.get(c)) for c in cols) + " |")
    if any(r.get("queue_ms") is None for r in rows):
        lines += ["", f"_–: not measured ({NOT_REPORTED}, or no first token)._"]
    return "\n".join(lines)


def expected_markdown(rows: list[dict[str, Any]], forecast: Forecast | None, plan: Plan | None) -> str:
    """This series' TTFT and tok/s p50 beside what the performance model expects for one user with its
    prompts and replies (their medians), through the page; empty without replies or a prediction."""
    ttft = [float(r["ttft_ms"]) for r in rows if isinstance(r.get("ttft_ms"), (int, float))]
    speed = [
        float(r["decode_tok_s"]) for r in rows if isinstance(r.get("decode_tok_s"), (int, float)) and r["decode_tok_s"]
    ]
    if forecast is None or plan is None or not ttft:
        return (
            "" if forecast is not None or not ttft else "_No prediction to compare with: the engine's status has none._"
        )
    prompt = round(statistics.median(int(r.get("prompt_tokens") or 1) for r in rows))
    reply = round(statistics.median(int(r.get("output_tokens") or 1) for r in rows))
    p = forecast.again(plan, Load(1, (max(prompt, 1),), max(reply, 2), requests=4, path="page"))
    measured_ttft = statistics.median(ttft)
    line = (
        f"**Expected for one user** ({prompt}-token prompts, {reply}-token replies, through the page): TTFT p50 "
        f"{figure(p.ttft_p50_ms, ' ms')} against this series' {measured_ttft:.0f} ms "
        f"({signed(p.ttft_p50_ms.point, measured_ttft)})"
    )
    if speed:
        measured_speed = statistics.median(speed)
        line += (
            f"; {number(p.per_user_tokens_per_s.point)} tok/s per reply against {measured_speed:.1f} "
            f"({signed(p.per_user_tokens_per_s.point, measured_speed)})"
        )
    return f"{line}. _Host costs: {forecast.costs.source}._"


# -- every chat of a user, since the page started ------------------------------------------------
@dataclass
class AllChats:
    """The rows of every chat in this page process, per user (one process of the page: with
    several, each holds its own clients' chats)."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, user: str, row: dict[str, Any]) -> None:
        self.rows.setdefault(user, []).append(row)

    def of(self, user: str) -> list[dict[str, Any]]:
        return list(self.rows.get(user, []))


@dataclass
class EngineStarts:
    """Which engine starts have answered through this page: a reply is the first after its
    engine's start (its caches cold) once per start."""

    seen: set[tuple[str, float | None]] = field(default_factory=set)

    def first(self, base_url: str, started_at: float | None) -> bool:
        key = (base_url, started_at)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def received_at(created_at: str | None) -> float:
    """When Chainlit received a message, on ``time.perf_counter``'s clock: it stamps the message's
    ``created_at`` (UTC) on receipt, before its own handler work; now when that is unreadable or
    not within the last second (a clock step)."""
    now = time.perf_counter()
    try:
        stamp = datetime.fromisoformat(str(created_at).removesuffix("Z")).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return now
    behind = time.time() - stamp
    return now - behind if 0 <= behind < 1 else now
