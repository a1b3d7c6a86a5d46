"""``engine.extra_args`` may add vLLM flags, never repeat one the plan passes: vLLM takes the last
of two, so the plan shown, and its reasons, would not be what runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.commands import engine_argv, with_extra_args
from config.errors import SettingsError
from config.hardware import load_profile
from config.model import read_model
from config.planner import make_plan
from config.settings import WorkloadSettings

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
