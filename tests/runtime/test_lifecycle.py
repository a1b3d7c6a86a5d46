"""A start's life beyond the happy path: one start per run directory and port, the cause of a failed
start named, and how often a dead engine is started again.

The starts here are real ``python -m backend`` processes against the session's engine; the second
start is refused before it launches anything, so these tests cost seconds, not an engine start
(the damaged-weights one launches vLLM, which fails while loading).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.ports import free_port
from support.services import DEMO_DIR, BackendProcess, Engine, backend_env, status_of

from backend.errors import EngineStartError, RunBusy
from backend.runtime.components.logwatch import LogState
from backend.runtime.processes.runlock import RunLock, claims_for
from backend.runtime.revive import PAUSES_S, RestartBudget, Revival, bring_back
from backend.runtime.status import read_status


def test_a_second_serve_on_a_running_run_directory_is_refused_and_touches_nothing(engine: Engine) -> None:
    status_file = engine.run_dir / "status.json"
    before = status_file.read_bytes()
    assert engine.process.proc is not None
    second = BackendProcess(
        ["serve", "--model", "demo", "--engine-port", str(free_port())], backend_env(engine.run_dir)
    )
    assert second.start().wait(120) == 1
    said = f"error: another start is running on the run directory {engine.run_dir} (pid {engine.process.pid})"
    assert said in second.output() and "nothing was started" in second.output(), second.output()
    assert "launching" not in second.output() and "plan:" not in second.output()
    assert status_file.read_bytes() == before, "the running start's status was written over"
    assert status_of(engine.run_dir).state == "ready"


def test_a_second_up_on_a_running_run_directory_is_refused_before_it_starts_anything(engine: Engine) -> None:
    page_port, engine_port = free_port(), free_port()
    env = backend_env(engine.run_dir)
    second = BackendProcess(["up", "--model", "demo", "--port", str(page_port), "--engine-port", str(engine_port)], env)
    assert second.start().wait(120) == 1
    assert f"another start is running on the run directory {engine.run_dir}" in second.output(), second.output()
    assert "stopped " not in second.output(), "a second start stopped the first one's children"
    assert status_of(engine.run_dir).state == "ready"


def test_a_start_on_another_run_directory_but_the_same_engine_port_is_refused(engine: Engine, tmp_path: Path) -> None:
    """vLLM binds late, so the port check alone let both start; the port's claim refuses at once."""
    second = BackendProcess(["serve", "--model", "demo", "--engine-port", str(engine.port)], backend_env(tmp_path))
    assert second.start().wait(120) == 1
    said = f"another start is running on port {engine.port} (pid {engine.process.pid}): stop it first"
    assert said in second.output() and "--engine-port" in second.output(), second.output()
    assert read_status(tmp_path) is None, "a refused start wrote a status"


def test_a_claim_is_all_or_nothing_and_free_again_once_released(tmp_path: Path) -> None:
    port = free_port()
    first = RunLock(claims_for(tmp_path / "a", [(port, "--engine-port")]))
    first.acquire()
    other_dir = RunLock(claims_for(tmp_path / "b", [(port, "--engine-port")]))
    with pytest.raises(RunBusy, match=rf"port {port} \(pid \d+\).*or choose another --engine-port"):
        other_dir.acquire()
    assert not other_dir.held, "the run directory it took first was not given back"
    own_dir = RunLock(claims_for(tmp_path / "b", []))
    own_dir.acquire()  # b itself was free
    own_dir.release()
    first.release()
    other_dir.acquire()
    assert other_dir.held
    other_dir.release()


def test_restarts_pause_longer_each_time_and_stop_at_the_limit_within_the_window() -> None:
    budget = RestartBudget(limit=3, window_s=600)
    assert [budget.next_pause(100.0) for _ in range(3)] == list(PAUSES_S[:3])
    assert budget.next_pause(100.0) is None and "restarted 3 times within 10 minutes" in budget.exhausted_text()
    assert budget.next_pause(100.0 + 600 + PAUSES_S[2]) == PAUSES_S[0], "old restarts still counted"
    off = RestartBudget(limit=0)
    assert off.next_pause(0.0) is None and off.exhausted_text() == "not restarted (engine.restart_limit is 0)"


def test_one_restart_loop_says_each_step_and_gives_up_with_why_it_did_not_come_back() -> None:
    """``bring_back`` (the keeper's loop for engines and the router, ``up``'s for the page)."""
    said: list[str] = []
    seen: list[str] = []

    def fails() -> None:
        raise EngineStartError("port 8001 is already in use\nmore")

    revival = Revival(
        label="the router",
        why="the router exited (code -9)",
        relaunch=lambda: seen.append("relaunch"),
        until_back=fails,
        back=lambda n: seen.append(f"back {n}"),
        give_up=lambda why: seen.append(f"gave up: {why}"),
        announce=lambda text: seen.append(f"announce: {text}"),
    )
    bring_back(revival, RestartBudget(limit=1), said.append)
    assert said == ["note: the router exited (code -9); restarting it (restart 1 of 1 within 10 min)"]
    assert seen == [
        "announce: the router exited (code -9); restarting it (1 of 1)",
        "relaunch",
        "gave up: the router did not come back (port 8001 is already in use); restarted 1 times within 10 minutes "
        "(engine.restart_limit), not again",
    ]
    backs: list[int] = []
    back = Revival("the page", "the page exited (code 1)", lambda: None, lambda: None, backs.append, seen.append)
    bring_back(back, RestartBudget(limit=3), said.append)
    assert backs == [1], "back after the first restart, with the restarts within the window"
    bring_back(back, RestartBudget(limit=3), said.append, stopped=lambda: True)
    assert backs == [1], "nothing once the run stops"


VLLM_FAILED_LOAD = """\
(Worker pid=11429) ERROR 12-06 00:28:51 [multiproc_executor.py:953] Traceback (most recent call last):
(Worker pid=11429) ERROR 12-06 00:28:51 [multiproc_executor.py:953] safetensors._safetensors_rust.SafetensorError: \
Error while deserializing header: incomplete metadata, file not fully covered
(EngineCore pid=11280) ERROR 12-06 00:28:54 [core.py:1510] Exception: WorkerProc initialization failed due to an \
exception in a background process. See stack trace for root cause.
Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_the_cause_of_a_failed_start_is_the_root_exception_not_its_relays() -> None:
    """vLLM's last lines relay a child's failure ("See root cause above"); the cause is the child's."""
    log = LogState()
    for line in VLLM_FAILED_LOAD.splitlines():
        log.feed(line)
    assert log.cause == "SafetensorError: Error while deserializing header: incomplete metadata, file not fully covered"


def test_a_start_on_truncated_weights_names_the_file_before_vllm_starts(engine: Engine, tmp_path: Path) -> None:
    """The demo checkpoint (which the session's engine made) with its weights cut in half: the start
    fails before any vLLM process, and the terminal and the status name the file, the cause and the fix,
    not "Engine core initialization failed" after vLLM's start."""
    model = tmp_path / "cut-model"
    shutil.copytree(DEMO_DIR, model)
    weights = next(model.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    run_dir = tmp_path / "run"
    start = BackendProcess(["serve", "--model", str(model), "--engine-port", str(free_port())], backend_env(run_dir))
    assert start.start().wait(120) == 2, start.output()
    said = f"{weights.name} is damaged (cut short or not safetensors: its tensors need "
    assert said in start.output() and "download the model again" in start.output(), start.output()
    assert "launching vLLM" not in start.output(), start.output()
    status = status_of(run_dir)
    assert status.state == "failed" and said in (status.error or "")
