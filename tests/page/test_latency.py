"""Each reply's first-token time split into its parts, and the ``/latency`` panel, on the real page
and engine (whose plan turns vLLM's per-request metrics and prompt-token details on)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import uuid
from typing import TYPE_CHECKING, Any

import httpx
from support.app_client import ChatClient, footer_of
from support.held import long_reply_held
from support.services import Engine
from support.waiting import until_async

from backend.engine_api import ChatResult
from backend.measure.plots import plot_latency
from backend.measure.stats import ratio_of_medians
from backend.page.latency import (
    COLUMNS,
    NOT_REPORTED,
    comparison,
    panel_markdown,
    split_line,
    summary,
    timing_row,
    to_csv,
)

if TYPE_CHECKING:
    from backend.runtime.up import ChatPage

SPLIT = re.compile(
    r"· queue (\d+) ms · prefill (\d+) ms \((\d+) of (\d+) prompt tokens cached\) · HTTP (\d+) ms · page (\d+) ms"
    r" · \d\d:\d\d:\d\d"
)
"""The footer's parts of the first token, as the engine on this machine reports them."""


def split_of(reply: dict[str, Any]) -> dict[str, int]:
    """The footer's parts (ms, tokens); fails when the footer does not split the first token."""
    m = SPLIT.search(reply["output"])
    assert m, f"the footer does not split the first token: {reply['output'][-300:]!r}"
    queue, prefill, cached, prompt, http, page = (int(g) for g in m.groups())
    return {"queue": queue, "prefill": prefill, "cached": cached, "prompt": prompt, "http": http, "page": page}


def panel_of(tab: ChatClient, message_id: str) -> dict[str, Any]:
    """The panel the page answered a ``/latency`` message with (its last message since)."""
    panels = [m for m in tab.messages() if (m.get("metadata") or {}).get("panel") == "latency"]
    assert panels, f"no latency panel after /latency; messages: {tab.texts()[-3:]}"
    return panels[-1]


async def csv_rows(tab: ChatClient, panel: dict[str, Any]) -> list[dict[str, str]]:
    files = [e for e in tab.elements if e.get("forId") == panel["id"] and str(e.get("name", "")).endswith(".csv")]
    assert len(files) == 1, f"the panel offers no CSV: {[e.get('name') for e in tab.elements]}"
    text = (await tab.file(files[0])).decode()
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames or ()) == COLUMNS, reader.fieldnames
    return list(reader)


def test_every_footer_splits_the_first_token_and_latency_shows_percentiles_and_a_csv(chainlit_app: ChatPage) -> None:
    async def run() -> None:
        async with ChatClient(chainlit_app.url) as tab:
            replies = [await tab.ask(f"Tell me about rivers, part {i}. [{uuid.uuid4().hex[:8]}]") for i in range(3)]
            for reply in replies:
                ttft, tokens, _ = footer_of(reply)
                parts = split_of(reply)
                total = parts["queue"] + parts["prefill"] + parts["http"] + parts["page"]
                assert abs(total - ttft) <= 3, f"the parts ({parts}) do not add up to the TTFT {ttft} ms"
                assert parts["prompt"] > 0 and parts["cached"] <= parts["prompt"]
                row = reply["metadata"]["timing"]
                assert row["output_tokens"] == tokens and json.loads(json.dumps(row)) == row, "a plain JSON row"
            assert [r["metadata"]["timing"]["reply"] for r in replies] == [1, 2, 3]
            # the conversation grows: its earlier turns come from the engine's prefix cache
            assert split_of(replies[2])["cached"] > 0, "no prompt tokens reported from the prefix cache"

            panel = panel_of(tab, await tab.command("latency"))
            for figure in ("p50", "p90", "p99", "TTFT (ms)", "3 replies", "**Expected for one user**"):
                assert figure in panel["output"], f"{figure!r} missing from the panel: {panel['output'][:400]}"
            rows = await csv_rows(tab, panel)
            assert [int(r["reply"]) for r in rows] == [1, 2, 3], "one CSV row per reply"
            # the CSV keeps 0.1 ms, the footer whole ms, both from one measurement: at most 0.55 ms apart
            gaps = [abs(float(r["ttft_ms"]) - footer_of(reply)[0]) for r, reply in zip(rows, replies, strict=True)]
            assert max(gaps) <= 0.55, f"the CSV's TTFT is not the footer's: {gaps}"
            shown = [e.get("name") for e in tab.elements if e.get("forId") == panel["id"]]
            assert "latency.png" in shown and any(str(n).endswith(".json") for n in shown), shown

            await tab.command("latency", "reset")
            await tab.ask(f"And about lakes? [{uuid.uuid4().hex[:8]}]")
            panel = panel_of(tab, await tab.command("latency"))
            assert "1 reply" in panel["output"] and len(await csv_rows(tab, panel)) == 1, "a new series"

            await tab.command("latency", "sideways")
            assert "Unknown `/latency` option 'sideways'" in tab.texts()[-1]

        async with ChatClient(chainlit_app.url) as other:  # another chat of the same (local) user
            await other.ask(f"Say hello. [{uuid.uuid4().hex[:8]}]")
            panel = panel_of(other, await other.command("latency", "all"))
            chats = {r["chat"] for r in await csv_rows(other, panel)}
            assert len(chats) >= 2, f"/latency all shows one chat only: {chats}"
            assert (await other.ask(f"Still here? [{uuid.uuid4().hex[:8]}]"))["output"], "the chat goes on"

    asyncio.run(run())


def test_a_new_chat_is_in_the_database_while_its_reply_is_on_its_way(chainlit_app: ChatPage, engine: Engine) -> None:
    """The user's message and the chat's name are written when the page takes the message, not after the
    reply (a page process that dies mid-reply lost both, and the chat left the history); the empty reply is
    still shown before the first token. The reply is held on its way (the engine stopped), not hoped long."""
    first = f"Name this chat {uuid.uuid4().hex[:8]}"

    async def listed() -> bool:
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(
                f"{chainlit_app.url}/project/threads", json={"pagination": {"first": 100}, "filter": {}}
            )
        r.raise_for_status()
        return any(thread["name"] == first for thread in r.json()["data"])

    async def run() -> None:
        async with ChatClient(chainlit_app.url) as tab:
            async with long_reply_held(tab, engine, ask=lambda: tab.send(first)) as (mid, _):
                reply = tab.reply_to(mid)
                assert reply is not None
                assert await until_async("the chat listed while its reply is on its way", listed, bool, timeout=60)
                assert mid not in tab.finished, "the reply ended while the engine was held"
                assert tab.history_of(reply["id"])[0] == "", "the first token came before the empty reply"
                await tab.stop()  # the rest of the reply is not needed
            await tab.wait_for(lambda: mid in tab.finished, 300)

    asyncio.run(run())


def test_a_part_the_engine_does_not_report_is_said_not_guessed() -> None:
    """vLLM 0.24 (the GPU build) has no per-request metrics: the footer says so, and the row keeps None."""
    res = ChatResult()
    res.absorb({"choices": [{"delta": {"content": "a"}}]}, 0.050)
    res.absorb({"choices": [{"delta": {"content": "b"}, "finish_reason": "length"}]}, 0.060)
    res.absorb({"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 9}}, 0.061)
    res.sent_s = 0.002
    res.finish(0.061)
    row = timing_row(res, reply=1, chat="c", first_after_start=False)
    assert row["queue_ms"] is None and row["prefill_ms"] is None and row["http_ms"] is None
    line = split_line(row)
    assert NOT_REPORTED in line and "cached prompt tokens: not reported" in line and "page 2 ms" in line
    # where vLLM reports them, the parts add up to what the page waited
    res.absorb(
        {
            "choices": [],
            "usage": {"completion_tokens": 2, "prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}},
            "metrics": {"queue_time_ms": 1.0, "time_to_first_token_ms": 40.0, "mean_itl_ms": 10.0},
        },
        0.061,
    )
    row = timing_row(res, reply=1, chat="c", first_after_start=True)
    assert (row["queue_ms"], row["prefill_ms"], row["http_ms"], row["cached_tokens"]) == (1.0, 40.0, 7.0, 4)
    assert split_line(row).startswith("queue 1 ms · prefill 40 ms (4 of 9 prompt tokens cached) · HTTP 7 ms")
    stats = {s["figure"]: s for s in summary([row, dict(row, ttft_ms=70.0)])}
    assert (stats["TTFT (ms)"]["count"], stats["TTFT (ms)"]["min"], stats["TTFT (ms)"]["max"]) == (2, 50.0, 70.0)


def rows_of_two_setups() -> list[dict[str, Any]]:
    """Four messages, each answered by both setups in turn (the first alternating): the compared setup's
    first token twice as slow as the plan's, its decoding the same."""
    rows: list[dict[str, Any]] = []
    for message in range(4):
        pair = [("plan", 10.0 + message), ("vllm serve defaults", 20.0 + 2 * message)]
        for setup, ttft in pair if message % 2 == 0 else pair[::-1]:
            rows.append(
                {"reply": len(rows) + 1, "setup": setup, "ttft_ms": ttft, "tpot_ms": 5.0, "decode_tok_s": 200.0}
            )
    return rows


def test_two_setups_are_compared_per_figure_with_the_ratio_of_medians_and_its_spread() -> None:
    rows = rows_of_two_setups()
    lines = {line["figure"]: line for line in comparison(rows)}
    ttft = lines["TTFT (ms)"]
    assert (ttft["plan p50"], ttft["vllm serve defaults p50"]) == (11.5, 23.0)
    ratio, low, high = ttft["vllm serve defaults ratio"]
    assert ratio == 2.0 and low <= 2.0 <= high
    assert ratio_of_medians([10, 11, 12, 13], [20, 22, 24, 26]) == (ratio, low, high), "the same rows, the same spread"
    assert lines["decode tok/s"]["vllm serve defaults ratio"] == (1.0, 1.0, 1.0)
    assert lines["TTFT: queue (ms)"]["vllm serve defaults ratio"] is None, "nothing measured: no ratio"
    panel = panel_markdown(rows, "Latency, this chat")
    assert "| figure | plan p50 | plan p90 | plan p99 | vllm serve defaults p50 |" in panel
    assert "| TTFT (ms) | 11.5 |" in panel and f"| 2.00 ({low:.2f}-{high:.2f}) |" in panel
    assert "Replies per setup: plan 4, vllm serve defaults 4" in panel and "| reply | setup |" in panel
    # one setup: the panel as it was, no setup column
    plain = panel_markdown([r for r in rows if r["setup"] == "plan"], "Latency, this chat")
    assert "| figure | count | min |" in plain and "| reply | at |" in plain
    table = list(csv.DictReader(io.StringIO(to_csv(rows).decode())))
    assert [r["setup"] for r in table] == ["plan", "vllm serve defaults", "vllm serve defaults", "plan"] * 2
    png = io.BytesIO()
    assert plot_latency(rows, png) is None and png.getvalue().startswith(b"\x89PNG")


def test_a_ratio_of_medians_needs_both_series_and_a_first_median_above_zero() -> None:
    assert ratio_of_medians([], [1.0]) is None and ratio_of_medians([0.0, 0.0], [1.0]) is None
    assert ratio_of_medians([2.0, 2.0, 2.0], [3.0, 3.0, 3.0]) == (1.5, 1.5, 1.5)
