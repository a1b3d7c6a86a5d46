"""The vLLM server process: started in its own process group, stopped with everything it spawned."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from backend.errors import EngineStartError


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def unwind_on_signals() -> None:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` stops what it started; SIGINT too,
    even when a non-interactive shell started this process with SIGINT ignored."""
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGINT, signal.default_int_handler)


IN_USE = "is already in use"


def bind_problem(host: str, port: int) -> str | None:
    """Why a server cannot listen on (host, port): ``IN_USE``, or the system's reason (a name that
    does not resolve, an address this machine does not have); None when it can."""
    try:
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return IN_USE
        return f"cannot be listened on ({err.strerror or err})"
    return None


def port_in_use(host: str, port: int) -> bool:
    """True when a server could not listen on (host, port) now (something holds it)."""
    return bind_problem(host, port) is not None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (for engines started by tune and benchmarks)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, n: int = 8) -> str:
    """The last ``n`` lines of a child's log, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no log)"


class EngineProcess:
    """One vLLM OpenAI-compatible server and its worker processes."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        """``env`` goes on top of ``base_env`` (default: this process's environment)."""
        self.argv = argv
        self.env = env
        self.base_env = base_env
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it from here
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env={**(os.environ if self.base_env is None else self.base_env), **self.env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
                start_new_session=True,  # own process group: one signal reaches every worker
            )
        except FileNotFoundError as err:
            raise EngineStartError(
                f"cannot run the engine's Python '{self.argv[0]}': {err.strerror}; "
                "set engine.python (ERNIECHAT_ENGINE__PYTHON) or run the set-up script"
            ) from None
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def tail(self, n: int = 8) -> str:
        return log_tail(self.log_path, n)

    def lower_priority(self, name_prefix: str, nice: int) -> list[int]:
        """Renice every thread of this engine's processes whose name starts with ``name_prefix``
        (Linux nice is per thread; threads started later inherit it). Returns their pids."""
        if not self.proc:
            return []
        found = []
        for pid in group_processes(self.proc.pid):
            try:
                if not Path(f"/proc/{pid}/comm").read_text().startswith(name_prefix):
                    continue
                for task in Path(f"/proc/{pid}/task").iterdir():
                    os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
            except (FileNotFoundError, ProcessLookupError):
                continue  # it exited meanwhile
            found.append(pid)
        return found

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the whole group, then SIGKILL what is left after the grace period."""
        if not self.proc:
            return
        stop_group(self.proc.pid, grace_s, self.proc.poll)
        self.proc.poll()


def stop_group(pgid: int, grace_s: float = 15.0, reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM to process group ``pgid``, then SIGKILL what is left after the grace period.
    ``reap``: collect the leader's exit when it is our own child (else it stays a zombie)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            reap()
            if not group_processes(pgid, live=True):
                return
            time.sleep(0.2)


def group_processes(pgid: int, live: bool = False) -> list[int]:
    """Pids in process group ``pgid`` (Linux /proc; empty elsewhere); ``live``: leaving out zombies,
    which a group keeps until someone reaps them (init may not, in a container)."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == pgid and not (live and fields[0] == "Z"):  # after the name: state, ppid, pgrp
            pids.append(int(entry.parent.name))
    return sorted(pids)
