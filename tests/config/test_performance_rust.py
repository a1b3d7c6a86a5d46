"""The performance model's vLLM Rust frontend: a plan that runs it predicted ahead of the same plan with Python
API servers, the invariants on every GPU profile, its shares against the measurements they were fitted to,
``vllm serve`` with it beside the defaults, and a calibration on a plan that runs it."""

from __future__ import annotations

import math

import pytest
from support.performance import ERNIE, FIGURES, check, model, warmup_samples

from config.errors import PlanError
from config.hardware import Hardware, list_profiles, load_profile
from config.model import ModelSpec
from config.performance import (
    GPU_HOST_DEFAULTS,
    RUST_FRONTEND_SHARES,
    HostCosts,
    Load,
    Prediction,
    layout_of,
    predict,
    vllm_defaults,
)
from config.performance.calibrate import calibrate
from config.performance.forecast import forecast
from config.performance.prediction import predict_point
from config.performance.text import forecast_lines
from config.plan import Plan
from config.planner import make_plan
from config.settings import WorkloadSettings

GPU_PROFILES = [p for p in list_profiles() if load_profile(p).has_gpu]


def ernie() -> ModelSpec:
    return model(ERNIE)


def at(hw: Hardware, plan: Plan, users: int) -> Prediction:
    """The plan at ``users``, 512-token prompts and 128-token replies, with the GPU defaults."""
    return predict_point(layout_of(plan, hw), ernie(), Load(users, (512,), 128), GPU_HOST_DEFAULTS)


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_a_rust_frontend_plan_is_predicted_ahead_of_the_same_plan_with_python_api_servers(profile: str) -> None:
    """More tokens/s at 128 and 256 users, a shorter first token at one: the same plan, its front end pinned."""
    hw, m = load_profile(profile), ernie()
    rust = make_plan(hw, m, WorkloadSettings(users=256), {"rust_frontend": True})  # several engines: a pin
    python = make_plan(hw, m, WorkloadSettings(users=256), {"rust_frontend": False})
    assert rust.rust_frontend and not python.rust_frontend
    for users in (128, 256):
        ours, theirs = at(hw, rust, users), at(hw, python, users)
        assert ours.output_tokens_per_s.point > theirs.output_tokens_per_s.point, (users, ours, theirs)
    assert at(hw, rust, 1).ttft_p50_ms.point < at(hw, python, 1).ttft_p50_ms.point
    if profile == "1xH100":  # three engines under MPS: 2 Python API servers each at 16 tokens a chunk against one Rust
        for users in (128, 256):
            gain = at(hw, rust, users).output_tokens_per_s.point / at(hw, python, users).output_tokens_per_s.point
            assert gain > 1.04, (users, gain)


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_rust_frontend_plans_keep_the_models_invariants_on_every_gpu_profile(profile: str) -> None:
    """Finite figures inside their bands, for the plan and for ``vllm serve`` with the Rust frontend; more users
    never wait fewer milliseconds."""
    hw, m = load_profile(profile), ernie()
    plan = make_plan(hw, m, WorkloadSettings(users=256), {"rust_frontend": True})
    assert plan.rust_frontend
    for layout in (layout_of(plan, hw), vllm_defaults(hw, m, plan.dtype, rust_frontend=True)):
        assert layout.rust_frontend
        check(predict(layout, m, Load(8, (64, 512), 32), GPU_HOST_DEFAULTS))
        for users in (1, 256):
            p = predict_point(layout, m, Load(users, (512,), 128), GPU_HOST_DEFAULTS)
            assert all(math.isfinite(getattr(p, k).point) and getattr(p, k).point > 0 for k in FIGURES), p
    layout = layout_of(plan, hw)
    waits = [
        predict_point(layout, m, Load(users, (512,), 64), GPU_HOST_DEFAULTS).queue_ms
        for users in (1, 2, 4, 8, 16, 64, 256, 1024)
    ]
    assert waits == sorted(waits) and waits[-1] > waits[0], waits


# The measurements the shares were fitted to: one H100 host, 16 cores, vLLM 0.24, `vllm serve DIR` alone with and
# without VLLM_USE_RUST_FRONTEND=1, `vllm bench serve` random 512 in / 128 out, one run per level (2026-12-07).
PLAIN = {1: 636, 16: 5496, 128: 19765, 256: 15858}
RUST = {1: 672, 16: 6093, 128: 26169, 256: (28055 + 27503) / 2}
ENGINE_CORE = ("step_ms", "seq_us", "prompt_us", "launch_layer_us")
API_SERVER = ("request_ms", "tokenize_us", "token_us", "chunk_us")


def measured_host() -> HostCosts:
    """That host's costs as ``RUST_FRONTEND_SHARES`` says they were taken: the defaults with the engine core's
    times 0.61x, the Python API server's 0.86x and the latency 0.90x."""
    update = {k: getattr(GPU_HOST_DEFAULTS, k) * 0.606 for k in ENGINE_CORE}
    update |= {k: getattr(GPU_HOST_DEFAULTS, k) * 0.861 for k in API_SERVER}
    update["latency_ms"] = GPU_HOST_DEFAULTS.latency_ms * 0.900
    return GPU_HOST_DEFAULTS.model_copy(update=update)


def test_the_rust_frontends_shares_reproduce_vllm_serve_with_it_against_its_plain_defaults() -> None:
    """On the measured host's costs (its plain defaults' one-user TPOT and TTFT and 256-user tokens/s), the Rust
    server's tokens/s over the plain defaults' within 15 % of the measured ratio at every level, and its one-user
    TTFT's too (8.0 against 12.2 ms)."""
    hw, m = load_profile("1xH100"), ernie()
    plain, rust = vllm_defaults(hw, m, "bfloat16"), vllm_defaults(hw, m, "bfloat16", rust_frontend=True)
    assert (plain.label, rust.label) == ("vllm serve (defaults)", "vllm serve (Rust frontend)")
    costs = measured_host()
    theirs = {u: predict_point(plain, m, Load(u, (512,), 128), costs) for u in PLAIN}
    ours = {u: predict_point(rust, m, Load(u, (512,), 128), costs) for u in PLAIN}
    assert theirs[1].tpot_p50_ms.point == pytest.approx(1.44, rel=0.03), "the host: its one-user TPOT"
    assert theirs[1].ttft_p50_ms.point == pytest.approx(12.2, rel=0.03), "the host: its one-user TTFT"
    assert theirs[256].output_tokens_per_s.point == pytest.approx(PLAIN[256], rel=0.03), "the host: 256 users"
    for users in PLAIN:
        predicted = ours[users].output_tokens_per_s.point / theirs[users].output_tokens_per_s.point
        measured = RUST[users] / PLAIN[users]
        assert predicted == pytest.approx(measured, rel=0.15), (users, predicted, measured)
    ttft = ours[1].ttft_p50_ms.point / theirs[1].ttft_p50_ms.point
    assert ttft == pytest.approx(8.0 / 12.2, rel=0.15)
    assert 0 < RUST_FRONTEND_SHARES.cpu < 1 and RUST_FRONTEND_SHARES.threads > 1, "a share of the CPU, on threads"


def test_the_rust_frontend_works_on_several_cores_not_one() -> None:
    """Its CPU per token over its threads sets the pace where one core would: at a Python server's share on one
    thread it is as slow as the defaults at 256 users; on its threads it is not."""
    hw, m = load_profile("1xH100"), ernie()
    rust, load = vllm_defaults(hw, m, "bfloat16", rust_frontend=True), Load(256, (512,), 128)
    whole = RUST_FRONTEND_SHARES.model_copy(update={"cpu": 1.0})
    one_core = GPU_HOST_DEFAULTS.model_copy(update={"rust_frontend": whole.model_copy(update={"threads": 1.0})})
    threaded = GPU_HOST_DEFAULTS.model_copy(update={"rust_frontend": whole})
    slow, quick = (predict_point(rust, m, load, c).output_tokens_per_s.point for c in (one_core, threaded))
    assert quick > 1.2 * slow, (slow, quick)


def test_vllm_serve_with_the_rust_frontend_is_predicted_beside_the_defaults_on_a_gpu_only() -> None:
    m = ernie()
    gpu, cpu = load_profile("1xH100"), load_profile("cpu-only")
    plan = make_plan(gpu, m, WorkloadSettings(users=256))
    f = forecast(plan, gpu, m, GPU_HOST_DEFAULTS, users=256, prompt_tokens=512, reply_tokens=128)
    assert f.rust_at_load and f.rust_at_one and f.rust_at_load.layout == "vllm serve (Rust frontend)"
    assert f.rust_at_load.output_tokens_per_s.point > f.defaults_at_load.output_tokens_per_s.point
    assert f.rust_gain is not None and f.gain is not None and 1 < f.rust_gain < f.gain
    lines = forecast_lines(f)
    assert any(
        line.startswith("vllm serve with VLLM_USE_RUST_FRONTEND=1 at 256 / 1 user: ") and "the plan" in line
        for line in lines
    ), lines
    on_cpu = make_plan(cpu, m, WorkloadSettings(users=8))
    g = forecast(on_cpu, cpu, m, GPU_HOST_DEFAULTS, users=8, prompt_tokens=512, reply_tokens=64)
    assert g.rust_at_load is None and g.rust_gain is None
    assert not any("RUST_FRONTEND" in line for line in forecast_lines(g))
    with pytest.raises(PlanError, match="VLLM_USE_RUST_FRONTEND=1 runs on a GPU only"):
        vllm_defaults(cpu, m, on_cpu.dtype, rust_frontend=True)


def test_a_warmup_on_a_rust_frontend_plan_calibrates_through_its_shares() -> None:
    """What the warm-up measured is the Rust server's: the fitted costs give it back on the plan, and a Python
    server's figures are the Rust server's over its shares (a plan with Python servers on this host is then
    predicted from them)."""
    hw, m = load_profile("1xH100"), ernie()
    plan = make_plan(hw, m, WorkloadSettings(users=8))
    assert plan.rust_frontend
    truth = GPU_HOST_DEFAULTS.model_copy(
        update={
            "step_ms": GPU_HOST_DEFAULTS.step_ms * 1.4,
            "request_ms": GPU_HOST_DEFAULTS.request_ms * 1.6,
            "latency_ms": GPU_HOST_DEFAULTS.latency_ms * 1.6,
        }
    )
    samples = warmup_samples(plan, hw, m, truth)
    layout = layout_of(plan, hw)
    fitted = calibrate(layout, m, samples, GPU_HOST_DEFAULTS, measured_on=hw.name, measured_at="2026-12-07")
    assert fitted.step_ms == pytest.approx(truth.step_ms, rel=0.05)
    assert fitted.latency_ms == pytest.approx(truth.latency_ms, rel=0.05)
    assert fitted.request_ms == pytest.approx(truth.request_ms, rel=0.05)
    rust = fitted.front_end(True)
    assert rust.latency_ms == pytest.approx(truth.latency_ms * RUST_FRONTEND_SHARES.latency, rel=0.05)
    assert all(abs(v) < 1.0 for v in fitted.fit.values()), fitted.fit
    short = next(s for s in samples if s.shape == "short")
    again = predict_point(layout, m, Load(1, (short.prompt_tokens,), 16, requests=1), fitted)
    assert again.ttft_p50_ms.point == pytest.approx(short.ttft_s * 1e3, rel=0.05)
