"""Two setups planned side by side (``up --compare``): each for its half of the machine, the compared one
as vLLM's own defaults or the plan with values pinned, and a pair that cannot run at once refused with
the reason and what would fit. No engine starts here: what ``up --compare`` runs is in
tests/page/test_compare.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.services import clear_settings_env

from backend.cli.main import main
from config.commands import GIB, plan_ports
from config.compare import (
    COMPARE_DIR,
    DEFAULTS_LABEL,
    NOT_PASSED,
    CompareSpec,
    Pair,
    parse_compare,
    plan_pair,
)
from config.errors import PlanError, SettingsError
from config.settings import Settings, load_settings

DATA = Path(__file__).resolve().parents[1] / "data"
MODEL = DATA / "ernie-4.5-0.3b-pt.json"
TWO_CORES = """name = "two cores"
nodes = 1

[node]
cpu_cores = 2
memory_gib = 24
cpu_flags = ["avx2", "avx512f"]
"""


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """Settings for a profile (and pins), this test's own run directory, nothing from the shell."""
    clear_settings_env(monkeypatch)

    def make(hardware: str, **pins: str) -> Settings:
        over: dict[str, Any] = {"engine.hardware": hardware, "model.id": "baidu/ERNIE-4.5-0.3B-PT"}
        over |= {"engine.run_dir": str(tmp_path / "run"), "engine.port": 8000}
        if pins:
            over["engine.pins"] = pins
        return load_settings(over)

    return make


def pair(settings: Settings, compare: str) -> Pair:
    return plan_pair(settings, parse_compare(compare), MODEL)


def argv(planned: Any) -> list[str]:
    return planned.plan.commands[0].argv


def env(planned: Any, engine: int = 0) -> dict[str, str]:
    return planned.plan.commands[engine].env


def test_compare_reads_defaults_or_pins_and_workload_keys_and_says_what_is_wrong() -> None:
    assert parse_compare("defaults") == CompareSpec(defaults=True)
    spec = parse_compare("max_num_seqs=4, objective=latency")
    assert spec.pins == {"max_num_seqs": "4"} and spec.workload == {"objective": "latency"}
    assert spec.label == "objective=latency max_num_seqs=4"
    for bad, words in (
        ("", "give 'defaults' or KEY=VALUE"),
        ("defaults max_num_seqs=4", "'defaults' stands alone"),
        ("max_num_seqs", "expected KEY=VALUE"),
        ("colour=red", "not a plan value or a workload key; allowed: tensor_parallel_size"),
        ("max_num_seqs=4 max_num_seqs=8", "given twice (4 and 8)"),
    ):
        with pytest.raises(SettingsError, match=words.replace("(", r"\(").replace(")", r"\)")):
            parse_compare(bad)


def test_vllm_defaults_beside_the_plan_on_a_cpu_each_on_its_half(settings: Any, tmp_path: Path) -> None:
    both = pair(settings("cpu-only"), "defaults")
    first, second = both.first, both.second
    for planned in (first, second):
        assert planned.hardware.node.cpu_cores == 4 and planned.hardware.node.memory_bytes == 16 * GIB
    assert env(first)["VLLM_CPU_OMP_THREADS_BIND"] == "0-3" and env(second)["VLLM_CPU_OMP_THREADS_BIND"] == "4-7"
    assert second.plan.vllm_defaults and both.label == DEFAULTS_LABEL
    # what a user types: the model, its name and address; its KV cache share and the footer's metrics
    line = argv(second)
    assert line[line.index("-m") + 1 :] == [
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL.parent),
        "--served-model-name",
        "baidu/ERNIE-4.5-0.3B-PT",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
        "--kv-cache-memory-bytes",
        str(second.plan.cpu_kv_cache_space_gib * GIB),  # type: ignore[operator]
        "--enable-per-request-metrics",
        "--enable-prompt-tokens-details",
    ]
    assert env(second) == {"VLLM_CPU_OMP_THREADS_BIND": "4-7"}, "nothing of the plan's environment"
    # the values shown are vLLM's own: the model's whole context, its CPU batch limits
    assert second.plan.max_model_len == 131072 and second.plan.max_num_seqs == 128
    assert second.plan.max_num_batched_tokens == 2048 and second.plan.engine_core_nice == 0
    assert second.plan.reasons["max_num_seqs"] == NOT_PASSED and not second.plan.pinned
    assert first.plan.engine_core_nice == 19 and "--max-num-seqs" in argv(first), "the plan is the plan"
    assert both.second_settings.engine.run_dir == tmp_path / "run" / COMPARE_DIR


def test_the_compared_setup_listens_after_the_plans_last_port_and_splits_its_own_cores(settings: Any) -> None:
    """A routed compared setup (two engines) on an 8-core machine: its engines on 4-5 and 6-7, its router and
    engines on the ports after the plan's."""
    both = pair(settings("cpu-only"), "engines_per_gpu=2")
    assert plan_ports(both.first.plan, 8000) == [8000]
    assert both.second_settings.engine.port == 8001
    assert plan_ports(both.second.plan, 8001) == [8001, 8002, 8003, 8004]
    assert [env(both.second, i)["VLLM_CPU_OMP_THREADS_BIND"] for i in (0, 1)] == ["4-5", "6-7"]
    assert env(both.first)["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"


def test_vllm_defaults_beside_the_plan_on_a_gpu_each_take_half_its_memory_share(settings: Any) -> None:
    both = pair(settings("1xH100"), "defaults")
    first, second = both.first.plan, both.second.plan
    assert first.gpu_memory_utilization == second.gpu_memory_utilization == 0.45
    assert "a compared setup runs beside it on the same GPU" in first.reasons["gpu_memory_utilization"]
    line = argv(both.second)
    assert line[line.index("-m") + 1 : line.index("--served-model-name")] == [
        "vllm.entrypoints.cli.main",
        "serve",
        str(MODEL.parent),
    ]
    assert line[line.index("--port") + 2 :] == ["--gpu-memory-utilization", "0.45", "--enable-prompt-tokens-details"]
    # vLLM's own batch limits on a GPU of 70 GiB or more (not an A100)
    assert (second.max_num_seqs, second.max_num_batched_tokens) == (1024, 8192)
    assert second.async_scheduling and second.tensor_parallel_size == 1
    assert first.rust_frontend and not second.rust_frontend, "vLLM's defaults run its Python API server"
    assert "VLLM_USE_RUST_FRONTEND" not in env(both.second)


def test_two_engines_per_gpu_share_the_plans_half(settings: Any) -> None:
    """A plan that shares a big GPU between two engines keeps sharing, within its half."""
    both = plan_pair(settings("1xH200"), parse_compare("engines_per_gpu=2"), MODEL)
    assert both.second.plan.engines_per_gpu == 2 and both.second.plan.gpu_memory_utilization == 0.21


@pytest.mark.parametrize(
    ("hardware", "pins", "compare", "words"),
    [
        (
            "1xH100",
            {"gpu_memory_utilization": "0.9"},
            "defaults",
            "take 0.90 + 0.45 = 1.35 of GPU 0's memory together, more than 0.95; would fit: "
            "gpu_memory_utilization=0.47 or less",
        ),
        (
            "cpu-only",
            {},
            "cpu_kv_cache_space_gib=100",
            "the compared setup (cpu_kv_cache_space_gib=100) cannot run beside the other on CPU only (8 cores, 32 "
            "GiB), each on half (4 of its 8 cores, 16.0 GiB of RAM): cpu_kv_cache_space_gib=100: only 13.3 GiB of "
            "RAM is left after weights and runtime; valid on this hardware: 1..13",
        ),
        ("2node-2xA10", {}, "defaults", "compare on one node"),
    ],
)
def test_a_pair_that_cannot_run_at_once_is_refused_with_what_would_fit(
    settings: Any, hardware: str, pins: dict[str, str], compare: str, words: str
) -> None:
    with pytest.raises(PlanError) as err:
        pair(settings(hardware, **pins), compare)
    assert words in str(err.value), str(err.value)


def test_two_cores_hold_two_setups_of_one_core_each_not_a_second_engine(settings: Any, tmp_path: Path) -> None:
    profile = tmp_path / "two.toml"
    profile.write_text(TWO_CORES)
    with pytest.raises(PlanError, match=r"engines_per_gpu=2: each CPU engine needs a core of its own; valid: 1\.\.1"):
        pair(settings(str(profile)), "engines_per_gpu=2")
    same = pair(settings(str(profile)), "engines_per_gpu=1")
    assert [env(p)["VLLM_CPU_OMP_THREADS_BIND"] for p in (same.first, same.second)] == ["0", "1"]
    assert any("runs what the plan runs" in note for note in same.notes), same.notes
    other = pair(settings(str(profile)), "max_num_seqs=2")
    assert other.second.plan.max_num_seqs == 2 and not any("runs what the plan runs" in n for n in other.notes)


def test_plan_prints_both_setups(settings: Any, capsys: pytest.CaptureFixture[str]) -> None:
    settings("cpu-only")  # the shell's settings variables cleared
    assert main(["plan", "--hardware", "cpu-only", "--model", str(MODEL), "--json", "--compare", "defaults"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["setup"] for s in doc["setups"]] == ["plan", DEFAULTS_LABEL]
    assert [s["vllm_defaults"] for s in doc["setups"]] == [False, True]
    assert "each run on half of CPU only (8 cores, 32 GiB)" in doc["notes"][0]
