"""The performance model over every shipped profile x published model config: finite figures inside their
bands, physics where it says so (more bandwidth never slower, more users never less queueing), the gain
over vLLM's defaults where it was measured, and the calibration from a warm-up's samples and back."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from support.performance import DATA, ERNIE, FIGURES, check, model, warmup_samples

from config.calibrated import calibrated_path, costs_for, save_calibrated
from config.errors import HardwareError
from config.hardware import Hardware, list_profiles, load_profile
from config.model import ModelSpec
from config.performance import (
    BOUNDS,
    CPU_HOST_DEFAULTS,
    GPU_HOST_DEFAULTS,
    HostCosts,
    Load,
    layout_of,
    predict,
    vllm_defaults,
)
from config.performance.calibrate import CalibrationError, WarmupSample, calibrate
from config.performance.forecast import forecast
from config.performance.prediction import predict_point
from config.plan import Plan
from config.planner import PlanError, make_plan
from config.settings import WorkloadSettings

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted(p.stem for p in DATA.glob("*.json"))


def plans() -> list[tuple[str, str, Hardware, ModelSpec, Plan]]:
    """Every (profile, model) the planner makes a plan for."""
    found = []
    for profile in list_profiles():
        hw = load_profile(profile)
        for name in MODELS:
            m = model(name)
            try:
                found.append((profile, name, hw, m, make_plan(hw, m, WorkloadSettings(users=32))))
            except PlanError:
                continue  # a model too big for the hardware: the planner says so, nothing to predict
    return found


PLANS = plans()


def costs(device: str) -> HostCosts:
    return CPU_HOST_DEFAULTS if device == "cpu" else GPU_HOST_DEFAULTS


def test_every_profile_and_model_gets_finite_figures_inside_their_bands() -> None:
    assert len(PLANS) >= 80, "most profiles x models have a plan"
    for profile, name, hw, m, plan in PLANS:
        load = Load(32, (512,), 64)
        for layout in (layout_of(plan, hw), vllm_defaults(hw, m, plan.dtype)):
            p = predict_point(layout, m, load, costs(plan.device))
            for key in FIGURES:
                assert math.isfinite(getattr(p, key).point) and getattr(p, key).point > 0, (profile, name, key)
    for _, _, hw, m, plan in PLANS[::7]:  # the band's two ends on a seventh of them
        check(predict(layout_of(plan, hw), m, Load(8, (64, 512), 32), costs(plan.device)))


def faster(hw: Hardware, factor: float) -> Hardware:
    gpus = tuple(
        g.model_copy(update={"memory_bandwidth_gbs": (g.memory_bandwidth_gbs or 0) * factor}) for g in hw.node.gpus
    )
    return hw.model_copy(update={"node": hw.node.model_copy(update={"gpus": gpus})})


@pytest.mark.parametrize(
    ("profile", "name"), [("1xA10", "llama-3.1-8b"), ("1xL4", "mistral-7b-v0.3"), ("1xH100", ERNIE)]
)
def test_more_memory_bandwidth_never_predicts_slower(profile: str, name: str) -> None:
    hw, m = load_profile(profile), model(name)
    plan = make_plan(hw, m, WorkloadSettings(users=16))
    for users in (1, 16, 64):
        load = Load(users, (512,), 128)
        slow, quick = (predict_point(layout_of(plan, h), m, load, GPU_HOST_DEFAULTS) for h in (hw, faster(hw, 2)))
        assert quick.output_tokens_per_s.point >= slow.output_tokens_per_s.point, (users, slow, quick)
        assert quick.tpot_p50_ms.point <= slow.tpot_p50_ms.point
        assert quick.ttft_p50_ms.point <= slow.ttft_p50_ms.point * 1.001
    if name != ERNIE:  # a 7-8 B model's decode reads its weights every step: the bound, and twice the bandwidth shows
        one = Load(1, (512,), 128)
        slow, quick = (predict_point(layout_of(plan, h), m, one, GPU_HOST_DEFAULTS) for h in (hw, faster(hw, 2)))
        assert slow.bound == "memory" and quick.tpot_p50_ms.point < 0.7 * slow.tpot_p50_ms.point


@pytest.mark.parametrize("profile", ["cpu-only", "1xA10", "1xH100", "2xA100-nvlink", "2node-2xA10", "8xH200-nvlink"])
def test_more_users_never_wait_fewer_milliseconds(profile: str) -> None:
    hw, m = load_profile(profile), model(ERNIE)
    plan = make_plan(hw, m, WorkloadSettings(users=256))
    layout, c = layout_of(plan, hw), costs(plan.device)
    waits = [predict_point(layout, m, Load(users, (512,), 64), c).queue_ms for users in (1, 2, 4, 8, 16, 64, 256, 1024)]
    assert waits == sorted(waits), waits
    assert waits[-1] > waits[0]


def test_the_256_user_plan_is_predicted_ahead_of_vllms_defaults_where_it_was_measured_ahead() -> None:
    """BENCHMARKS.md#headline, one H100: 1.66x at 128 users and 2.56x at 256; about even at 1."""
    hw, m = load_profile("1xH100"), model(ERNIE)
    plan = make_plan(hw, m, WorkloadSettings(users=256))
    ours, theirs = layout_of(plan, hw), vllm_defaults(hw, m, plan.dtype)
    gain = {
        users: predict_point(ours, m, load, GPU_HOST_DEFAULTS).output_tokens_per_s.point
        / predict_point(theirs, m, load, GPU_HOST_DEFAULTS).output_tokens_per_s.point
        for users in (128, 256)
        for load in [Load(users, (512,), 128)]
    }
    assert gain[128] > 1.3 and gain[256] > 1.8, gain
    assert theirs.api_servers == 1 and theirs.stream_interval == 1 and theirs.max_num_seqs == 1024


def test_a_split_across_nodes_and_replicas_on_nodes_are_predicted() -> None:
    hw, big, small = load_profile("2node-2xA10"), model("qwen3-30b-a3b"), model(ERNIE)
    split = make_plan(hw, big, WorkloadSettings(users=8))
    replicas = make_plan(hw, small, WorkloadSettings(users=64))
    assert split.split_across_nodes and replicas.replicated_across_nodes
    s = predict_point(layout_of(split, hw), big, Load(8, (512,), 64), GPU_HOST_DEFAULTS)
    one_node = replace(layout_of(split, hw), split_nodes=False)
    assert s.tpot_p50_ms.point > predict_point(one_node, big, Load(8, (512,), 64), GPU_HOST_DEFAULTS).tpot_p50_ms.point
    r = predict_point(layout_of(replicas, hw), small, Load(64, (512,), 64), GPU_HOST_DEFAULTS)
    assert layout_of(replicas, hw).engines == replicas.total_engines == 4
    assert r.output_tokens_per_s.point > s.output_tokens_per_s.point


# -- calibration ------------------------------------------------------------------------------------
@pytest.mark.parametrize("ends_ms", [0.0, 10.0])
@pytest.mark.parametrize(("profile", "base"), [("cpu-only", CPU_HOST_DEFAULTS), ("1xH100", GPU_HOST_DEFAULTS)])
def test_calibration_finds_the_costs_a_warmup_measured(profile: str, base: HostCosts, ends_ms: float) -> None:
    """Also where every stream spends a time of its own at its ends (10 ms: a 16-token reply's time from first
    to last token 0.67 ms a token longer): the per-step and per-sequence costs are the host's, fitted to how far
    apart the longer replies' tokens came, alone and together."""
    hw, m = load_profile(profile), model(ERNIE)
    plan = make_plan(hw, m, WorkloadSettings(users=8))
    rate = "cpu_gflops_per_core" if plan.device == "cpu" else "gpu_efficiency"
    truth = base.model_copy(
        update={
            "step_ms": base.step_ms * 1.7,
            "seq_us": base.seq_us * 0.5,
            rate: getattr(base, rate) * 0.6,
            "sample_us": base.seq_us * 3,
        }
    )
    samples = warmup_samples(plan, hw, m, truth, ends_s=ends_ms * 1e-3)
    fitted = calibrate(layout_of(plan, hw), m, samples, base, measured_on=hw.name, measured_at="2026-12-07")
    assert (
        fitted.kind == "calibrated" and fitted.measured_on == hw.name and "calibrated on this machine" in fitted.source
    )
    assert fitted.step_ms == pytest.approx(truth.step_ms, rel=0.05)
    assert fitted.seq_us == pytest.approx(truth.seq_us, rel=0.15)
    assert fitted.sample_us == pytest.approx(truth.sample_us, rel=0.15), "the draw's cost apart from greedy steps"
    assert getattr(fitted, rate) == pytest.approx(getattr(truth, rate), rel=0.1)
    assert all(abs(v) < 1.0 for v in fitted.fit.values()), fitted.fit
    # a warm-up of before the longer replies: the 16-token replies' own time per token, the concurrent round's
    older = [s for s in samples if s.shape not in ("reply", "decode")]
    again = calibrate(layout_of(plan, hw), m, older, base, measured_on=hw.name, measured_at="2026-12-07")
    if ends_ms:
        assert again.step_ms > truth.step_ms * 1.1, "their ends drawn into the time per token"
    else:
        assert again.step_ms == pytest.approx(truth.step_ms, rel=0.05)


def test_a_warmup_without_its_prompts_alone_is_not_calibrated() -> None:
    hw, m = load_profile("cpu-only"), model(ERNIE)
    plan = make_plan(hw, m, WorkloadSettings(users=8))
    steady = [WarmupSample(shape="steady", prompt_tokens=60, concurrency=1, ttft_s=0.02, total_s=0.08, tokens=16)]
    with pytest.raises(CalibrationError, match="short, medium and long"):
        calibrate(layout_of(plan, hw), m, steady, CPU_HOST_DEFAULTS, measured_on=hw.name, measured_at="2026-12-07")


def test_calibrated_costs_are_kept_per_machine_and_used_by_the_next_plan_for_it_alone(tmp_path: Path) -> None:
    name = "this machine: CPU only (2 cores, 24 GiB)"
    mine = CPU_HOST_DEFAULTS.model_copy(
        update={"kind": "calibrated", "measured_on": name, "step_ms": 9.5, "source": "calibrated on this machine"}
    )
    assert costs_for(tmp_path, name, "cpu") == (CPU_HOST_DEFAULTS, None)
    path = save_calibrated(tmp_path, mine, "cpu")
    assert path == calibrated_path(tmp_path, name, "cpu") and path.parent.name == "calibrated"
    assert costs_for(tmp_path, name, "cpu") == (mine, None)
    assert costs_for(tmp_path, "1x NVIDIA H100", "cuda") == (GPU_HOST_DEFAULTS, None), (
        "another machine's plan: defaults"
    )
    path.write_text("{not json")
    used, note = costs_for(tmp_path, name, "cpu")
    assert used == CPU_HOST_DEFAULTS and note and str(path) in note and "delete it" in note


def test_a_forecast_says_which_costs_it_used_and_the_gain() -> None:
    hw, m = load_profile("1xH100"), model(ERNIE)
    plan = make_plan(hw, m, WorkloadSettings(users=256))
    f = forecast(plan, hw, m, GPU_HOST_DEFAULTS, users=256, prompt_tokens=512, reply_tokens=128)
    assert f.at_load.users == 256 and f.at_one.users == 1 and f.defaults_at_load.layout == "vllm serve (defaults)"
    assert f.gain is not None and f.gain > 1.5
    assert "BENCHMARKS.md#headline" in f.costs.source and "not measured on this host" in f.costs.source
    again = f.again(plan, Load(16, (512,), 128))
    assert again.users == 16 and type(f).model_validate_json(f.model_dump_json()) == f


def test_a_profiles_gpu_figures_are_checked_and_named_when_wrong(tmp_path: Path) -> None:
    text = (
        (Path(load_profile("1xA10").source))
        .read_text()
        .replace("memory_bandwidth_gbs = 600", 'memory_bandwidth_gbs = "fast"')
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(
        HardwareError, match=r"node\.gpus\[0\]\.memory_bandwidth_gbs = 'fast': must be a number of GB/s"
    ):
        load_profile(str(bad))
    assert all(g.memory_bandwidth_gbs and g.bf16_tflops for p in list_profiles() for g in load_profile(p).node.gpus)


# -- shown: plan and predict ------------------------------------------------------------------------
def cli(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ERNIECHAT_")}
    env.update(HF_HUB_OFFLINE="1", ERNIECHAT_ENGINE__RUN_DIR=str(run_dir))
    return subprocess.run(
        [sys.executable, "-m", "backend", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )


H100_256 = ("--hardware", "1xH100", "--model", str(DATA / f"{ERNIE}.json"), "--users", "256", "--reply-tokens", "128")


def test_plan_says_what_it_expects_at_its_load_and_at_one_user_and_which_costs(tmp_path: Path) -> None:
    done = cli(tmp_path, "plan", *H100_256)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())  # unwrapped
    assert "expected (the performance model, BENCHMARKS.md#prediction):" in out
    assert "at 256 users, 512-token prompts, 128-token replies: " in out and "at 1 user: " in out
    assert re.search(r"[\d,]+ tok/s \([\d,]+-[\d,]+\), [\d.,]+ tok/s per user; TTFT p50 [\d.,]+ ms \(", out), out
    assert "bound: " in out and re.search(r"vllm serve \(defaults\) at 256 / 1 user: .* the plan \d\.\d\dx at 256", out)
    assert re.search(r"vllm serve with VLLM_USE_RUST_FRONTEND=1 at 256 / 1 user: [\d,]+ / [\d,]+ tok/s, .* plan", out)
    assert "host costs: defaults fitted to BENCHMARKS.md#headline" in out
    data = json.loads(cli(tmp_path, "plan", *H100_256, "--json").stdout)["expected"]
    assert data["at_load"]["users"] == 256 and data["at_one"]["users"] == 1 and data["costs"]["kind"] == "default"
    assert set(data["at_load"]["ttft_p50_ms"]) == {"point", "low", "high"} and data["at_load"]["bound"] in BOUNDS
    # a warm-up on this machine calibrated the costs for this hardware: the next plan uses them, and says so
    calibrated = GPU_HOST_DEFAULTS.model_copy(
        update={
            "kind": "calibrated",
            "measured_on": "1x NVIDIA H100",
            "step_ms": 4.2,
            "source": "calibrated on this machine (...)",
        }
    )
    save_calibrated(tmp_path, calibrated, "cuda")
    again = json.loads(cli(tmp_path, "plan", *H100_256, "--json").stdout)["expected"]
    assert again["costs"]["kind"] == "calibrated" and again["costs"]["step_ms"] == 4.2
    assert again["at_one"]["tpot_p50_ms"]["point"] > data["at_one"]["tpot_p50_ms"]["point"]


def test_predict_shows_a_plan_files_loads_beside_vllms_defaults(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(cli(tmp_path, "plan", *H100_256, "--json").stdout)
    model_flags = ("--hardware", "1xH100", "--model", str(DATA / f"{ERNIE}.json"), "--reply-tokens", "128")
    done = cli(tmp_path, "predict", "--plan-file", str(plan_file), *model_flags, "--at", "1,16,128")
    assert done.returncode == 0, done.stderr
    assert "3 engines under MPS behind the router on 1x NVIDIA H100" in done.stdout
    rows = [line for line in done.stdout.splitlines() if re.match(r"\s+\d+\s+[\d,]+ \(", line)]
    assert [int(r.split()[0]) for r in rows] == [1, 16, 128], done.stdout
    assert all(re.search(r"\s\d+\.\d\dx\s", r) for r in rows), "each load's gain over vLLM's defaults"
    assert "+ Rust frontend" in done.stdout and all(len(re.findall(r"\d\.\d\dx", r)) == 2 for r in rows), (
        "and over vllm serve with the Rust frontend"
    )
    each = cli(tmp_path, "predict", "--plan-file", str(plan_file), *model_flags, "--at", "128", "--sessions", "request")
    assert each.returncode == 0, each.stderr
    assert "each request a conversation of its own" in each.stdout and "each user one conversation" in done.stdout
    again = [line for line in each.stdout.splitlines() if re.match(r"\s+128\s+[\d,]+ \(", line)]
    ttft = [re.split(r"\s{2,}", r.strip())[2] for r in (rows[-1], *again)]
    assert len(ttft) == 2 and ttft[0] != ttft[1], "the router's turns move the first token's wait"
    bad = cli(tmp_path, "predict", *model_flags, "--at", "0,4")
    assert bad.returncode == 2 and "--at '0,4': every load is 1 user or more" in bad.stderr


def test_tokens_drawn_at_random_cost_each_sequence_what_the_host_measured_and_greedy_ones_do_not(
    tmp_path: Path,
) -> None:
    """The CPU engine's draw (the page's temperature and top-p) against greedy tokens: each sequence's step costs
    ``sample_us`` more; a host whose draw costs nothing apart predicts both alike."""
    hw, m = load_profile("cpu-only"), model(ERNIE)
    layout = layout_of(make_plan(hw, m, WorkloadSettings(users=8)), hw)
    for users in (1, 8):
        drawn, greedy = (
            predict_point(layout, m, Load(users, (512,), 64, sampled=s), CPU_HOST_DEFAULTS) for s in (True, False)
        )
        more_ms = drawn.tpot_p50_ms.point - greedy.tpot_p50_ms.point
        assert more_ms >= 0.5 * users * CPU_HOST_DEFAULTS.sample_us / 1e3, (
            users,
            drawn.tpot_p50_ms,
            greedy.tpot_p50_ms,
        )
        free = CPU_HOST_DEFAULTS.model_copy(update={"sample_us": 0.0})
        alike = [predict_point(layout, m, Load(users, (512,), 64, sampled=s), free) for s in (True, False)]
        assert alike[0].tpot_p50_ms == alike[1].tpot_p50_ms
    flags = ("predict", "--hardware", "cpu-only", "--model", str(DATA / f"{ERNIE}.json"), "--at", "1,8", "--json")
    said = {g: cli(tmp_path, *flags, *(("--greedy",) if g else ())) for g in (False, True)}
    assert all(done.returncode == 0 for done in said.values()), said
    speed = {
        g: [lv["plan"]["output_tokens_per_s"]["point"] for lv in json.loads(said[g].stdout)["levels"]] for g in said
    }
    assert all(d < g for d, g in zip(speed[False], speed[True], strict=True)), speed
