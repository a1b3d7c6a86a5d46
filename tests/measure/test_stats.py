"""The numbers of a load level: percentiles, time per output token and one level's record."""

from __future__ import annotations

import pytest

from backend.engine_api import ChatResult
from backend.measure.stats import percentile, summarize, tpot_s


def test_percentile_interpolates_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def result(ttft: float, total: float, tokens: int, error: str | None = None) -> ChatResult:
    step = (total - ttft) / max(tokens - 1, 1)
    return ChatResult(
        ttft_s=ttft,
        total_s=total,
        tokens=tokens,
        token_times=[ttft + i * step for i in range(tokens)],
        error=error,
    )


def test_summarize_computes_tpot_throughput_and_counts_errors() -> None:
    ok = [result(0.1, 1.1, 11), result(0.3, 2.3, 11)]
    failed = ChatResult(error="HTTP 500: boom")
    assert tpot_s(ok[0]) == pytest.approx(0.1)
    row = summarize([*ok, failed], concurrency=2, planned=3, wall_s=2.5)
    assert (row.requests, row.ok, row.errors) == (3, 2, 1)
    assert row.error_samples == ["HTTP 500: boom"]
    assert row.tpot_p50_ms == pytest.approx(150.0)  # 100 and 200 ms per token
    assert row.ttft_p50_ms == pytest.approx(200.0)
    assert row.ttft_p99_ms == pytest.approx(298.0)
    assert row.e2e_p99_ms is not None and row.e2e_p50_ms is not None and row.e2e_p99_ms >= row.e2e_p50_ms
    assert row.itl_p50_ms == pytest.approx(150.0)
    assert row.itl_max_ms == pytest.approx(200.0)  # the slower reply's gaps
    assert row.output_tokens_per_s == pytest.approx(22 / 2.5)
    assert row.requests_per_s == pytest.approx(2 / 2.5)


LEVEL_KEYS = [
    "concurrency",
    "requests_planned",
    "requests",
    "ok",
    "errors",
    "cut_off",
    "error_samples",
    "wall_s",
    "output_tokens",
    "tokens_per_request_mean",
    "output_tokens_per_s",
    "requests_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "itl_max_ms",
    "short_replies",
]


def test_a_level_dumps_to_the_keys_bench_json_has_always_had() -> None:
    page = summarize([result(0.1, 1.1, 11)], concurrency=1, planned=1, wall_s=1.0)
    assert list(page.model_dump(mode="json")) == LEVEL_KEYS, "a page level: no client figures"
    direct = page.model_copy(update={"client_processes": 1, "client_busy": 0.25})
    assert list(direct.model_dump(mode="json")) == [*LEVEL_KEYS, "client_processes", "client_busy"]
    empty = summarize([], concurrency=2, planned=2, wall_s=0.0).model_dump()
    assert empty["ttft_p50_ms"] is None and empty["itl_max_ms"] is None, "unmeasured latencies stay, as null"
