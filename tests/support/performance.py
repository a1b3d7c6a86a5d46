"""Helpers of the performance model's tests: the published model configs, a prediction's sanity, and what a
warm-up would have measured on a host whose costs are known."""

from __future__ import annotations

import math
from pathlib import Path

from config.hardware import Hardware
from config.model import ModelSpec, read_model
from config.performance import HostCosts, Load, Prediction, layout_of
from config.performance.calibrate import WarmupSample
from config.performance.prediction import decode_step_s, simulate_load
from config.plan import Plan

DATA = Path(__file__).resolve().parents[1] / "data"
FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "output_tokens_per_s", "per_user_tokens_per_s")
ERNIE = "ernie-4.5-0.3b-pt"


def model(name: str) -> ModelSpec:
    return read_model(DATA / f"{name}.json")


def check(p: Prediction) -> None:
    for key in FIGURES:
        f = getattr(p, key)
        assert all(math.isfinite(x) and x > 0 for x in (f.point, f.low, f.high)), (key, f)
        assert f.low <= f.point <= f.high, (key, f)
    assert p.ttft_p99_ms.point >= p.ttft_p50_ms.point
    assert math.isfinite(p.queue_ms) and p.queue_ms >= 0
    assert p.bound_text and p.costs


def warmup_samples(plan: Plan, hw: Hardware, m: ModelSpec, truth: HostCosts, ends_s: float = 0.0) -> list[WarmupSample]:
    """What a warm-up would have measured on a host whose costs are ``truth``: the model's own figures (the longer
    replies' tokens as far apart as the model's decoding steps, greedy and drawn), each stream ``ends_s`` longer at
    its ends (its last chunk, the usage, the close: a time the model does not charge)."""
    layout = layout_of(plan, hw)

    def timed(shape: str, load: Load, rnd: int = 0) -> list[WarmupSample]:
        fig = simulate_load(layout, m, load, truth)
        tokens = load.reply_tokens
        total = fig["ttft_s"] + (tokens - 1) * (fig["tpot_mean_s"] if load.users > 1 else fig["tpot_s"]) + ends_s
        context = sum(load.prompt_tokens) / len(load.prompt_tokens) + tokens / 2
        gap = (
            decode_step_s(layout, m, truth, load.users, context, fig["host"], sampled=load.sampled)
            if tokens > 16
            else None
        )
        return [
            WarmupSample(
                shape=shape,
                prompt_tokens=load.prompt_tokens[i % len(load.prompt_tokens)],
                concurrency=load.users,
                round=rnd,
                ttft_s=fig["ttft_s"],
                total_s=total,
                tokens=tokens,
                gap_s=gap,
                sampled=load.sampled,
            )
            for i in range(load.users)
        ]

    out = []
    for shape, prompt in (("short", 60), ("medium", 510), ("long", 1020), ("steady", 60)):
        out += timed(shape, Load(1, (prompt,), 16, requests=1))
    out += timed("concurrent", Load(8, (47, 227, 381), 16, requests=8), rnd=2)
    for sampled in (False, True):  # greedy and drawn as the page draws
        out += timed("reply", Load(1, (60,), 64, requests=1, sampled=sampled))
        out += timed("decode", Load(8, (60,), 64, requests=8, sampled=sampled))
    return out
