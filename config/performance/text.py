"""Predictions in words, one form for ``plan``, ``status``, ``bench`` and the page: a point, its band, and
what bounds it."""

from __future__ import annotations

from config.performance.forecast import Forecast
from config.performance.prediction import Figure, Prediction


def number(x: float) -> str:
    """1,234 for big figures, 12.3 / 1.23 for small ones."""
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def figure(f: Figure, unit: str = "") -> str:
    """'4,600 tok/s (3,900-5,400)'."""
    return f"{number(f.point)}{unit} ({number(f.low)}-{number(f.high)})"


def signed(predicted: float, measured: float) -> str:
    """The prediction's error against a measurement, signed: '+12 %' (predicted above), '-8 %'."""
    if measured <= 0:
        return "-"
    return f"{(predicted / measured - 1) * 100:+.0f} %"


def load_words(p: Prediction) -> str:
    users = f"{p.users} user{'s' if p.users != 1 else ''}"
    prompts = "/".join(str(n) for n in p.prompt_tokens)
    return f"{users}, {prompts}-token prompts, {p.reply_tokens}-token replies"


def summary(p: Prediction) -> str:
    """One line: tokens/s in all and per user, TTFT p50 and p99, TPOT, and the bound."""
    return (
        f"{figure(p.output_tokens_per_s, ' tok/s')}, {number(p.per_user_tokens_per_s.point)} tok/s per user; "
        f"TTFT p50 {figure(p.ttft_p50_ms, ' ms')}, p99 {figure(p.ttft_p99_ms, ' ms')}; "
        f"TPOT {figure(p.tpot_p50_ms, ' ms')}; bound: {p.bound_text}"
    )


def reference(name: str, at_load: Prediction, at_one: Prediction) -> str:
    """'NAME at 256 / 1 user: 14,121 / 405 tok/s, TTFT p50 532 / 15.3 ms'."""
    return (
        f"{name} at {at_load.users} / 1 user: {number(at_load.output_tokens_per_s.point)} / "
        f"{number(at_one.output_tokens_per_s.point)} tok/s, TTFT p50 {number(at_load.ttft_p50_ms.point)} / "
        f"{number(at_one.ttft_p50_ms.point)} ms"
    )


def forecast_lines(f: Forecast) -> list[str]:
    """``plan``'s and ``status``'s block: the plan at its load and at one user, vLLM's defaults beside it (and on
    a GPU ``vllm serve`` with vLLM's Rust frontend)."""
    lines = [
        f"at {load_words(f.at_load)}: {summary(f.at_load)}",
        f"at 1 user: {summary(f.at_one)}",
        reference("vllm serve (defaults)", f.defaults_at_load, f.defaults_at_one)
        + (f": the plan {f.gain:.2f}x at {f.at_load.users}" if f.gain else ""),
    ]
    if f.rust_at_load and f.rust_at_one:
        lines.append(
            reference("vllm serve with VLLM_USE_RUST_FRONTEND=1", f.rust_at_load, f.rust_at_one)
            + (f": the plan {f.rust_gain:.2f}x at {f.at_load.users}" if f.rust_gain else "")
        )
    lines.append(f"host costs: {f.costs.source}")
    lines += [f"note: {n}" for n in dict.fromkeys(f.at_load.notes + f.at_one.notes)]
    return lines


def markdown(f: Forecast) -> list[str]:
    """The page's Readme: the same as short markdown lines."""
    load, one = f.at_load, f.at_one
    return [
        f"**Expected** at {load_words(load)}: {summary(load)}  ",
        f"**Expected** at 1 user: TTFT p50 {figure(one.ttft_p50_ms, ' ms')}, "
        f"{number(one.per_user_tokens_per_s.point)} tok/s per reply  ",
        f"_Host costs: {f.costs.source}._  ",
    ]
