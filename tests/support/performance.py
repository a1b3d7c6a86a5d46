"""Helpers of the performance model's tests: the published model configs, a prediction's sanity, and what a
warm-up would have measured on a host whose costs are known."""

from __future__ import annotations

import math
from pathlib import Path

from config.hardware import Hardware
from config.model import ModelSpec, read_model
from config.performance import HostCosts, Load, Prediction, layout_of
from config.performance.calibrate import WarmupSample
from config.performance.prediction import simulate_load
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


def warmup_samples(plan: Plan, hw: Hardware, m: ModelSpec, truth: HostCosts) -> list[WarmupSample]:
    """What a warm-up would have measured on a host whose costs are ``truth``: the model's own figures."""
    layout = layout_of(plan, hw)
    out = []
    for shape, prompt in (("short", 60), ("medium", 510), ("long", 1020), ("steady", 60)):
        fig = simulate_load(layout, m, Load(1, (prompt,), 16, requests=1), truth)
        total = fig["ttft_s"] + 15 * fig["tpot_s"]
        out.append(
            WarmupSample(
                shape=shape, prompt_tokens=prompt, concurrency=1, ttft_s=fig["ttft_s"], total_s=total, tokens=16
            )
        )
    crowd = Load(8, (47, 227, 381), 16, requests=8)
    fig = simulate_load(layout, m, crowd, truth)
    for i in range(8):
        prompt = crowd.prompt_tokens[i % 3]
        total = fig["ttft_s"] + 15 * fig["tpot_mean_s"]
        out.append(
            WarmupSample(
                shape="concurrent",
                prompt_tokens=prompt,
                concurrency=8,
                round=2,
                ttft_s=fig["ttft_s"],
                total_s=total,
                tokens=16,
            )
        )
    return out
