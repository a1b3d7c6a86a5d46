"""The page's Readme and ``/latency`` beside what the plan is expected to deliver (the performance model)."""

from __future__ import annotations

import re
from pathlib import Path

from backend.page import render
from backend.page.latency import expected_markdown
from backend.runtime.rundir import RunDir
from backend.runtime.status import EngineStatus
from config.hardware import load_profile
from config.model import read_model
from config.performance import CPU_HOST_DEFAULTS, Load
from config.performance.forecast import Forecast, forecast
from config.plan import Plan
from config.planner import make_plan
from config.settings import WorkloadSettings

DATA = Path(__file__).resolve().parents[1] / "data"


def planned() -> tuple[Plan, Forecast]:
    hw, m = load_profile("cpu-only"), read_model(DATA / "ernie-4.5-0.3b-pt.json")
    plan = make_plan(hw, m, WorkloadSettings(users=8))
    return plan, forecast(plan, hw, m, CPU_HOST_DEFAULTS, users=8, prompt_tokens=512, reply_tokens=256)


def test_the_readme_shows_what_the_plan_is_expected_to_deliver(tmp_path: Path) -> None:
    plan, expected = planned()
    RunDir(tmp_path).write_plan(plan)
    status = EngineStatus(state="ready", plan_summary=plan.summary(), hardware=plan.hardware, expected=expected)
    page = render.plan_markdown(status, RunDir(tmp_path))
    assert "**Expected** at 8 users, 512-token prompts, 256-token replies: " in page
    assert re.search(
        r"\*\*Expected\*\* at 1 user: TTFT p50 [\d.,]+ ms \([\d.,]+-[\d.,]+\), [\d.,]+ tok/s per reply", page
    )
    assert "_Host costs: defaults fitted to BENCHMARKS.md#openmp-threads-on-cpu" in page
    assert "Expected" not in render.plan_markdown(status.model_copy(update={"expected": None}), RunDir(tmp_path))


def test_latency_puts_the_series_beside_the_prediction_for_one_user() -> None:
    plan, expected = planned()
    rows = [
        {"ttft_ms": ttft, "decode_tok_s": speed, "prompt_tokens": 40, "output_tokens": 120}
        for ttft, speed in ((30.0, 300.0), (34.0, 280.0), (90.0, 250.0))
    ]
    line = expected_markdown(rows, expected, plan)
    p = expected.again(plan, Load(1, (40,), 120, requests=4, path="page"))
    assert line.startswith("**Expected for one user** (40-token prompts, 120-token replies, through the page): ")
    assert f"against this series' 34 ms ({(p.ttft_p50_ms.point / 34 - 1) * 100:+.0f} %)" in line, line
    assert "tok/s per reply against 280.0" in line and "_Host costs: defaults" in line
    assert expected_markdown([], expected, plan) == ""
    assert expected_markdown(rows, None, plan) == "_No prediction to compare with: the engine's status has none._"
