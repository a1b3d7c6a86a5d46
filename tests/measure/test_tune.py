"""tune as a command (a dry run; once for real on this machine) and the tuned profiles it writes.

A real tune starts several engines (minutes each on CPU), so the real run here measures one
candidate; candidates and the choice are tested in test_tune_candidates and test_tune_selection.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.services import ROOT, Engine, backend_env, clear_settings_env

from backend.measure.tune.run import Spent, candidate_estimate
from config.hardware import load_profile
from config.pipeline import plan_for
from config.settings import Settings, load_settings
from config.tuned import (
    TunedProfile,
    TunedProfileError,
    load_tuned,
    profile_key,
    save_tuned,
    tuned_path,
)

DATA = ROOT / "tests" / "data"
ERNIE = DATA / "ernie-4.5-0.3b-pt.json"


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_time_budget_estimate_scales_start_up_by_engines_and_learns_the_warm_start() -> None:
    """The figures of `tune` at 128 on one H200 (BENCHMARKS.md): the default (two engines) first,
    cold, 216.4 s in all, 205.0 s of it to up; then one engine, warm, 73.0 s, 65.1 to up. The old
    estimate (the mean so far: 216 s) skipped the one-engine candidate in a 330 s budget."""
    cold_default = Spent(216.4, 205.0, 2)
    assert candidate_estimate([cold_default], 1) == pytest.approx(102.5 + 11.4)
    assert candidate_estimate([cold_default], 2) == pytest.approx(216.4)
    warm_one = Spent(73.0, 65.1, 1)
    assert candidate_estimate([cold_default, warm_one], 2) == pytest.approx(2 * 65.1 + (11.4 + 7.9) / 2)
    assert candidate_estimate([Spent(40.0, None, 1)], 1) == 40.0, "a failed start counts whole as start-up"


def test_tune_dry_run_lists_candidates_without_starting_engines(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "backend",
        "tune",
        "--dry-run",
        "--hardware",
        "2xH200-nvlink",
        "--model",
        str(ERNIE),
        "--max-candidates",
        "3",
    ]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = [line for line in done.stdout.splitlines() if line.startswith("  ") and ". " in line[:6]]
    assert len(listed) == 3 and listed[0].strip().startswith("1. default"), done.stdout
    assert all(" predicted " in line and " tok/s" in line and "bound: " in line for line in listed), done.stdout
    valid = int(re.search(r"(\d+) valid candidates ranked by prediction", done.stdout)[1])  # type: ignore[index]
    assert f"measuring the 3 best, {valid - 3} skipped" in done.stdout
    assert "predicted with host costs: defaults fitted to BENCHMARKS.md#headline" in done.stdout
    assert not (tmp_path / "tuned").exists()


# -- tuned profiles -------------------------------------------------------------------------------
def settings_for(run_dir: Path, monkeypatch: pytest.MonkeyPatch, **flat: Any) -> Settings:
    clear_settings_env(monkeypatch)
    monkeypatch.chdir(run_dir)  # no erniechat.toml here
    base = {"model.id": str(ERNIE), "engine.hardware": "cpu-only", "engine.run_dir": str(run_dir)}
    return load_settings({**base, **flat})


def profile_for(settings: Settings, pins: dict[str, Any], objective: str = "balanced") -> TunedProfile:
    return TunedProfile(
        hardware=load_profile(settings.engine.hardware).name,
        model=settings.model.id,
        objective=objective,
        pins=pins,
        measured_at="2026-11-30T12:00:00+00:00",
    )


def test_profile_key_is_a_safe_file_name() -> None:
    key = profile_key("this machine: 2x NVIDIA H200 (NVLink)", "baidu/ERNIE-4.5-0.3B-PT", "balanced")
    assert key == "this-machine-2x-nvidia-h200-nvlink--baidu-ernie-4-5-0-3b-pt--balanced"
    long = profile_key("h" * 300, "/a/very/long/path/" * 20, "latency")
    assert len(long) <= 120 and long != profile_key("h" * 300, "/a/very/long/path/" * 19, "latency")


def test_tuned_profile_round_trip(tmp_path: Path) -> None:
    p = TunedProfile(hardware="hw", model="demo", objective="balanced", pins={"max_num_seqs": 4})
    path = save_tuned(tmp_path, p)
    assert path == tuned_path(tmp_path, "hw", "demo", "balanced") and path.parent.name == "tuned"
    loaded, where = load_tuned(tmp_path, "hw", "demo", "balanced") or (None, None)
    assert loaded == p and where == path
    assert load_tuned(tmp_path, "hw", "demo", "latency") is None
    assert load_tuned(tmp_path, "other hw", "demo", "balanced") is None
    path.write_text("{not json")
    with pytest.raises(TunedProfileError, match="unreadable"):
        load_tuned(tmp_path, "hw", "demo", "balanced")
    with pytest.raises(TunedProfileError, match="not pinnable"):
        save_tuned(tmp_path, TunedProfile(hardware="hw", model="demo", objective="balanced", pins={"port": 1}))


def test_plan_for_applies_a_tuned_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(tmp_path, monkeypatch)
    before = plan_for(settings)
    assert not any("tuned profile" in n for n in before.notes)
    pins = {"max_num_seqs": before.plan.max_num_seqs + 3, "max_num_batched_tokens": 4096}
    path = save_tuned(tmp_path, profile_for(settings, pins))
    after = plan_for(settings)
    assert after.plan.max_num_seqs == pins["max_num_seqs"]
    assert after.plan.max_num_batched_tokens == 4096
    assert f"using tuned profile {path} (measured 2026-11-30)" in after.notes
    assert "tuned profile" in after.plan.reasons["max_num_seqs"]
    assert "pinned by you" not in after.plan.reasons["max_num_seqs"]


def test_user_pins_win_over_the_tuned_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(tmp_path, monkeypatch, **{"engine.pins": {"max_num_seqs": "7"}})
    save_tuned(tmp_path, profile_for(settings, {"max_num_seqs": 5, "max_num_batched_tokens": 4096}))
    planned = plan_for(settings)
    assert planned.plan.max_num_seqs == 7
    assert planned.plan.reasons["max_num_seqs"].startswith("pinned by you")
    assert planned.plan.max_num_batched_tokens == 4096, "the profile's other pins still apply"


def test_a_profile_for_another_objective_or_an_invalid_one_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(tmp_path, monkeypatch, **{"workload.objective": "latency"})
    save_tuned(tmp_path, profile_for(settings, {"max_num_seqs": 5}, objective="balanced"))
    planned = plan_for(settings)
    assert planned.plan.max_num_seqs != 5 and not any("tuned" in n for n in planned.notes)
    # A profile the planner now refuses (TP=2 on a CPU) is left out, with a note.
    save_tuned(tmp_path, profile_for(settings, {"tensor_parallel_size": 2}, objective="latency"))
    planned = plan_for(settings)
    assert planned.plan.tensor_parallel_size == 1
    assert any("not used" in n and "no GPU" in n for n in planned.notes), planned.notes


# -- tune, for real ------------------------------------------------------------------------------
def test_tune_on_this_machine_measures_the_default_and_saves_its_profile(engine: Engine, tmp_path: Path) -> None:
    """The whole command once: one candidate is one more engine start (about a minute here, eager as
    every engine a test starts for itself); the second does not fit the 1 s budget and is skipped, named."""
    out = tmp_path / "tune"
    argv = [sys.executable, "-m", "backend", "tune", "--model", "demo", "--max-candidates", "2"]
    argv += ["--concurrency", "2", "--requests", "4", "--max-tokens", "8", "--time-budget-s", "1", "--out", str(out)]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1/2 default" in done.stdout and "best: default" in done.stdout
    report = json.loads((out / "tune.json").read_text())
    assert report["partial"] is False and report["best"] == "default"
    second = report["chosen"][1]["name"]
    assert report["skipped"] == [second] and len(report["measured"]) == 1
    assert f"for {second} (1 engine); skipped" in done.stdout
    measured = report["measured"][0]
    assert measured["ok"] and measured["startup_s"] > 0 and measured["startup"]["to_health_s"] > 0
    assert (measured["target"]["ok"], measured["target"]["errors"], measured["single"]["ok"]) == (4, 0, 4)
    assert measured["target"]["client_processes"] == 1, "two cores: the engine needs them more than the client"
    assert report["default_vs_best"]["default_within_5pct"] is True
    # ranked by the performance model; the measured one's prediction and how far it was off
    assert report["ranked_out"] == report["candidates_valid"] - 2 and report["predicted_with"]
    assert measured["predicted"]["users"] == 2 and set(measured["prediction_error_pct"]) == {
        "output_tokens_per_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
    }
    assert re.search(r"predicted tokens/s [+-]\d+ %, TTFT p99 [+-]\d+ %", done.stdout), done.stdout
    profile = Path(report["profile"])
    assert profile.parent == tmp_path / "tuned" and json.loads(profile.read_text())["winner"] == "default"
    if has_matplotlib():
        assert (out / "tune.png").stat().st_size > 0
