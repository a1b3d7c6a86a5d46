"""The performance model behind the router when every request is a conversation of its own, as ``vllm bench serve``
sends them: the engines simulated together, taking requests in turn, a shared GPU's slowing step by step; against
the measured ``--users 256`` levels of one H100 (BENCHMARKS.md#prediction), read from the repository's raw data."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from support.performance import ERNIE, check, model

from config.hardware import list_profiles, load_profile
from config.performance import GPU_HOST_DEFAULTS, Load, layout_of, predict
from config.performance.prediction import predict_point
from config.performance.simulate import Front, Pool, SharedGpu, simulate
from config.performance.step import ShapeCosts, StepModel
from config.planner import make_plan
from config.settings import WorkloadSettings

ROOT = Path(__file__).resolve().parents[2]
LEVELS = ROOT / "docs" / "benchmarks" / "h100x1-all-levels"


def routed(profile: str) -> bool:
    hw = load_profile(profile)
    return make_plan(hw, model(ERNIE), WorkloadSettings(users=256)).routed


ROUTED = [p for p in list_profiles() if routed(p)]


def measured(users: int) -> dict[str, float]:
    """The median over the headline's runs of the ``--users 256`` plan at ``users`` (``vllm bench serve``'s JSONs)."""
    runs = [json.loads(p.read_text()) for p in sorted(LEVELS.glob(f"project-c{users}-r[0-9].json"))]
    assert len(runs) == 3 and all(r["max_concurrency"] == users and r["failed"] == 0 for r in runs)
    return {
        "output_tokens_per_s": statistics.median(r["output_throughput"] for r in runs),
        "ttft_p50_ms": statistics.median(r["median_ttft_ms"] for r in runs),
    }


@pytest.mark.parametrize("users", [128, 256])
def test_the_256_user_plans_measured_levels_land_within_the_targets(users: int) -> None:
    """Three engines under MPS behind the router, two Python API servers each, as measured (kept out of the fit of
    the host's default costs): tokens/s within 15 % and TTFT p50 within 30 % of the measured medians, each inside
    its band; the same figures when predicted again."""
    hw, m = load_profile("1xH100"), model(ERNIE)
    plan = make_plan(hw, m, WorkloadSettings(users=256), {"rust_frontend": False})
    assert (plan.engines_per_gpu, plan.api_server_count, plan.gpu_sharing) == (3, 2, "mps")
    load = Load(users, (512,), 128, sessions="request")
    p = predict(layout_of(plan, hw), m, load, GPU_HOST_DEFAULTS)
    check(p)
    want = measured(users)
    for key, target in (("output_tokens_per_s", 0.15), ("ttft_p50_ms", 0.30)):
        figure = getattr(p, key)
        assert figure.point == pytest.approx(want[key], rel=target), (key, figure, want[key])
        assert figure.inside(want[key]), (key, figure, want[key])
    assert predict(layout_of(plan, hw), m, load, GPU_HOST_DEFAULTS) == p


def test_requests_of_their_own_reach_the_engines_in_turn_a_users_stay_on_one() -> None:
    """Four users, three requests each, three engines: a user's conversation stays on its engine (6, 3, 3
    requests); requests each a conversation of their own go to the engines in turn (4, 4, 4)."""
    hw, m = load_profile("1xH100"), model(ERNIE)
    layout = layout_of(make_plan(hw, m, WorkloadSettings(users=256)), hw)
    step = StepModel(layout, GPU_HOST_DEFAULTS, ShapeCosts.of(m, layout.tp, layout.dtype_bytes))

    def served(in_turn: bool) -> list[int]:
        fronts = [Front(page=None, page_s=0.0, router_s=1e-3, latency_s=5e-3, api=Pool(2)) for _ in range(3)]
        return [r.requests for r in simulate(step, fronts, 4, (512,), 16, 3, in_turn=in_turn)]

    assert served(False) == [6, 3, 3]
    assert served(True) == [4, 4, 4]


def test_engines_sharing_a_gpu_slow_each_others_steps_time_sliced_more_than_under_mps() -> None:
    """Simulated together, each step is slowed by what the other engines run then: not at all by idle ones, more
    by busier ones, twice as much time-sliced as under MPS; the mean slowing is shown as the GPU's contention."""
    gpu = SharedGpu(3, 0.5, 0.25)
    assert gpu.slowing(1.0, 0.0) == 1.0 < gpu.slowing(1.0, 0.3) < gpu.slowing(1.0, 1.2)
    assert replace(gpu, weight=1.0).slowing(1.0, 0.6) - 1 == pytest.approx(2 * (gpu.slowing(1.0, 0.6) - 1))
    hw, m = load_profile("1xH100"), model(ERNIE)
    layout = layout_of(make_plan(hw, m, WorkloadSettings(users=256), {"rust_frontend": False}), hw)
    load = Load(128, (512,), 128, sessions="request")
    mps = predict_point(layout, m, load, GPU_HOST_DEFAULTS)
    sliced = predict_point(replace(layout, gpu_sharing="time-slice"), m, load, GPU_HOST_DEFAULTS)
    assert 1.0 < mps.gpu_contention < sliced.gpu_contention, (mps.gpu_contention, sliced.gpu_contention)
    assert sliced.output_tokens_per_s.point < mps.output_tokens_per_s.point


@pytest.mark.parametrize("profile", ROUTED)
def test_requests_in_turn_keep_the_models_invariants(profile: str) -> None:
    """Every routed plan: finite figures inside their bands; more users never wait fewer milliseconds."""
    hw, m = load_profile(profile), model(ERNIE)
    layout = layout_of(make_plan(hw, m, WorkloadSettings(users=256)), hw)
    check(predict(layout, m, Load(8, (64, 512), 32, sessions="request"), GPU_HOST_DEFAULTS))
    waits = [
        predict_point(layout, m, Load(users, (512,), 64, sessions="request"), GPU_HOST_DEFAULTS).queue_ms
        for users in (1, 2, 4, 8, 16, 64, 256, 1024)
    ]
    assert waits == sorted(waits) and waits[-1] > waits[0], waits
