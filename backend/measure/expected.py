"""``bench``'s predictions: each level as the performance model expects it under the same load (users,
prompt mix, reply length, request count, path), beside what was measured, with the signed error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel

from config.performance.forecast import Forecast
from config.performance.prediction import Figure, Load, Prediction
from config.performance.text import number
from config.plan import Plan

CHECKED = (
    ("output_tokens_per_s", "output_tokens_per_s"),
    ("ttft_p50_ms", "ttft_p50_ms"),
    ("ttft_p99_ms", "ttft_p99_ms"),
    ("tpot_p50_ms", "tpot_p50_ms"),
)
"""(prediction's figure, the level's measured figure)."""


class LevelCheck(BaseModel):
    """One level's prediction and how far it was from the measurement."""

    predicted: Prediction
    error_pct: dict[str, float | None]
    """(predicted / measured - 1) x 100 per figure: positive where the model expected more."""
    inside: dict[str, bool | None]
    """Whether the measurement fell inside the prediction's band."""


class MeasuredRow(Protocol):
    """A bench row as this module reads it (``bench.BenchRow``)."""

    concurrency: int
    path: str
    output_tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    expected: LevelCheck | None

    @property
    def variant(self) -> str: ...


def check(row: MeasuredRow, predicted: Prediction) -> LevelCheck:
    errors: dict[str, float | None] = {}
    inside: dict[str, bool | None] = {}
    for key, measured_key in CHECKED:
        fig: Figure = getattr(predicted, key)
        measured = getattr(row, measured_key)
        ok = measured is not None and measured > 0
        errors[key] = round((fig.point / measured - 1) * 100, 1) if ok else None
        inside[key] = fig.inside(measured) if ok else None
    return LevelCheck(predicted=predicted, error_pct=errors, inside=inside)


def expect_levels(
    rows: Sequence[MeasuredRow], config: Mapping[str, Any], forecast: Forecast, plan: Plan, forecast_setup: str = ""
) -> None:
    """Put each level's prediction (under the load ``config`` describes: bench.json's) and error on its row;
    with two compared setups only on the rows of ``forecast_setup``, the one the forecast is for."""
    mix = config.get("prompt_mix") or {}
    prompts = tuple(max(1, int(shape["tokens"])) for shape in mix.values()) or (1,)
    counts = config.get("requests_per_level") or {}
    for row in rows:
        if getattr(row, "setup", "") not in ("", forecast_setup):
            continue  # the setup compared beside the plan: the forecast is the plan's
        load = Load(
            row.concurrency,
            prompts,
            int(config["max_tokens"]),
            requests=int(counts.get(str(row.concurrency), 0)) or None,
            path="page" if row.path == "page" else "api",
            sampled=False,  # bench's requests are greedy, on either path
        )
        row.expected = check(row, forecast.again(plan, load))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0f}%"


def _pair(e: LevelCheck, key: str, measured: float | None) -> str:
    """'4,600 / 4,210' (predicted / measured), '*' where the measurement is outside the band."""
    mark = "" if e.inside.get(key) in (True, None) else "*"
    return f"{number(getattr(e.predicted, key).point)} / {'-' if measured is None else number(measured)}{mark}"


def expected_table(results: Sequence[MeasuredRow]) -> str:
    """Predicted against measured per level: tokens/s, TTFT p50 and p99, TPOT p50, each with its error;
    '*' marks a measurement outside the band."""
    rows = [r for r in results if r.expected is not None]
    if not rows:
        return ""
    head = (
        f"{'predicted vs measured':22} {'conc':>4}  {'tok/s pred / meas':>21} {'err':>5}  {'TTFT p50 ms':>15} "
        f"{'err':>5}  {'TTFT p99 ms':>15} {'err':>5}  {'TPOT p50 ms':>13} {'err':>5}  bound"
    )
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (r.concurrency, r.variant)):
        e = r.expected
        assert e is not None
        p = e.predicted

        lines.append(
            f"{r.variant:22} {r.concurrency:>4}  {_pair(e, 'output_tokens_per_s', r.output_tokens_per_s):>21} "
            f"{_pct(e.error_pct['output_tokens_per_s']):>5}  {_pair(e, 'ttft_p50_ms', r.ttft_p50_ms):>15} "
            f"{_pct(e.error_pct['ttft_p50_ms']):>5}  {_pair(e, 'ttft_p99_ms', r.ttft_p99_ms):>15} "
            f"{_pct(e.error_pct['ttft_p99_ms']):>5}  {_pair(e, 'tpot_p50_ms', r.tpot_p50_ms):>13} "
            f"{_pct(e.error_pct['tpot_p50_ms']):>5}  {p.bound}"
        )
    lines.append("* outside the predicted band")
    return "\n".join(lines)
