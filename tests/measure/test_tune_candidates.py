"""tune's candidates, on shipped hardware profiles and published model configs: enumeration
(every plan the planner accepts) and the order they are measured in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.services import ROOT

from backend.measure.tune.candidates import enumerate_candidates, inert, order_candidates
from backend.measure.tune.ranking import SAME, rank
from config.commands import engine_flags
from config.hardware import load_profile
from config.model import read_model
from config.performance import GPU_HOST_DEFAULTS, Load
from config.planner import make_plan
from config.settings import WorkloadSettings

DATA = ROOT / "tests" / "data"
ERNIE = DATA / "ernie-4.5-0.3b-pt.json"


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
    assert found[0].values["async_scheduling"], "on, as vLLM itself does with these executors"
    off = [c for c in found if not c.values["async_scheduling"]]
    assert off and all(c.pins.get("async_scheduling") is False for c in off), "tune measures it off"


def test_gpu_candidates_vary_engines_per_gpu_mps_graphs_and_the_front_end() -> None:
    found, _ = candidates("1xH200", users=256)
    assert found[0].values["engines_per_gpu"] == 3 and not found[0].values["rust_frontend"]
    (two,) = (c for c in found if c.changes == ("engines",))
    assert two.pins == {"engines_per_gpu": 2} and two.name == "2 engines per GPU" and two.plan.routed
    assert two.plan.gpu_memory_utilization > found[0].plan.gpu_memory_utilization, "two share the memory"
    assert found[0].values["gpu_sharing"] == "mps"
    sliced = next(c for c in found if c.changes == ("sharing", "engines"))  # time-sliced, the planner runs two
    assert sliced.pins == {"gpu_sharing": "time-slice"} and sliced.plan.engines_per_gpu == 2
    assert sliced.name == "GPU time-sliced, no MPS + 2 engines per GPU"
    assert (found[0].values["cudagraph_mode"], found[0].values["max_cudagraph_capture_size"]) == ("FULL", 1024)
    own = next(c for c in found if c.pins == {"cudagraph_mode": "auto"})  # the size follows the mode
    assert own.pins == {"cudagraph_mode": "auto"} and own.values["max_cudagraph_capture_size"] == 0
    assert own.changes == ("graphs", "engines") and own.name == "vLLM's own CUDA graphs + 2 engines per GPU"
    assert "--compilation-config" not in engine_flags(own.plan) and "--compilation-config" in engine_flags(
        found[0].plan
    )
    (rust,) = (c for c in found if c.changes == ("frontend",))
    assert rust.pins == {"rust_frontend": True} and rust.name == "vLLM's Rust frontend"
    assert (rust.values["api_server_count"], rust.values["stream_interval"]) == (1, 1)
    assert not any(c.values["rust_frontend"] and {"stream", "api x2", "api /2"} & set(c.changes) for c in found)
    ones, _ = candidates("1xH200", users=32)  # one engine: the Rust frontend, and Python API servers tried
    assert ones[0].values["rust_frontend"] and not any({"stream", "api x2"} & set(c.changes) for c in ones)
    assert next(c for c in ones if c.changes == ("frontend",)).values["api_server_count"] == 4
    pythons = found
    every = next(c for c in pythons if c.changes == ("stream",))
    assert every.values["stream_interval"] == 1 and every.name == "stream interval 1"
    api = pythons[0].values["api_server_count"]
    more = next(c for c in pythons if c.changes == ("api x2",))
    fewer = next(c for c in pythons if c.changes == ("api /2",))
    assert (more.values["api_server_count"], fewer.values["api_server_count"]) == (2 * api, api // 2)
    assert more.pins == {"api_server_count": 2 * api} and more.name == f"{2 * api} API servers"
    chosen = order_candidates(found, 2, "throughput", concurrency=256, long_prompt_tokens=512)
    assert chosen[1] is two, "engines per GPU is the first thing tried after splits"
    sixty_four, _ = candidates("1xH200", users=64)
    assert sixty_four[0].values["engines_per_gpu"] == 2
    # three first, under MPS it beat two; one engine is the time-sliced candidate's plan already (one of each plan)
    (three,) = (c for c in sixty_four if c.changes == ("engines",))
    assert (three.pins, three.name) == ({"engines_per_gpu": 3}, "3 engines per GPU")
    assert three.plan.gpu_memory_utilization < sixty_four[0].plan.gpu_memory_utilization, "three share the memory"
    alone = next(c for c in sixty_four if c.changes == ("sharing", "engines"))
    assert alone.plan.engines_per_gpu == 1 and not alone.plan.routed
    assert next(c for c in sixty_four if c.pins == {"cudagraph_mode": "auto"}).changes == ("graphs",), "still two"
    sliced_two, _ = candidates("1xH200", users=256, pins={"gpu_sharing": "time-slice"})
    assert [c.values["engines_per_gpu"] for c in sliced_two if c.changes == ("engines",)] == [1], (
        "three time-sliced engines lost to two (0.86x / 0.94x): not tried"
    )
    few, _ = candidates("1xH200", users=8)
    assert few[0].values["engines_per_gpu"] == 1
    assert any(c.values["engines_per_gpu"] == 2 and c.plan.routed for c in few)


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


def test_the_candidates_measured_are_the_default_and_the_best_predicted() -> None:
    """tune measures what the performance model ranks best at the target load; the rest are counted as
    skipped. At 256 users on one H100 the default (three engines under MPS) is predicted ahead of two, as measured
    (BENCHMARKS.md#three-engines-per-gpu: 1.15x)."""
    hw, model = load_profile("1xH100"), read_model(DATA / "ernie-4.5-0.3b-pt.json")
    candidates, _ = enumerate_candidates(hw, model, WorkloadSettings(users=256))
    load = Load(256, (60, 512, 2048), 64, requests=512)
    ranked = rank(
        candidates,
        hw,
        model,
        load,
        GPU_HOST_DEFAULTS,
        k=4,
        objective="balanced",
        objective_ms=None,
        long_prompt_tokens=2048,
    )
    assert ranked.chosen[0] is candidates[0] and len(ranked.chosen) == 4
    assert ranked.skipped == len(candidates) - 4 and set(ranked.predicted) == {c.name for c in candidates}
    tokens = {name: p.output_tokens_per_s.point for name, p in ranked.predicted.items()}
    worst_chosen = min(tokens[c.name] for c in ranked.chosen[1:])
    assert all(tokens[c.name] <= worst_chosen * (1 + SAME) for c in candidates if c not in ranked.chosen)
    assert tokens["2 engines per GPU"] < tokens["default"]
    strict = rank(
        candidates,
        hw,
        model,
        load,
        GPU_HOST_DEFAULTS,
        k=2,
        objective="balanced",
        objective_ms=1.0,
        long_prompt_tokens=2048,
    )
    assert len(strict.chosen) == 2, "none meets a 1 ms p99 TTFT: the best predicted are measured all the same"
