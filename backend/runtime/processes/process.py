"""A child process group (a vLLM server and its workers, the router, the chat page): started in its own
process group, stopped with everything it spawned."""

from __future__ import annotations

import errno
import os
import random
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from backend.errors import EngineStartError
from backend.runtime.processes.child_tmp import ChildTmp, OwnTmp
from backend.runtime.processes.groups import alive, group_processes, stop_group


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


FIRST_PORT = 10000
"""Ports for servers this project starts are drawn from here up to the kernel's ephemeral range."""
_GIVEN: set[int] = set()
"""Ports handed out in this process: two runs drawn for one start (a head's and its master port) are
free when drawn but not yet held, so a second draw could overlap the first."""


def free_run(count: int, host: str = "127.0.0.1") -> int:
    """A port P with P .. P + count - 1 free on ``host``, below the kernel's ephemeral range: a port
    the kernel hands out as free lies where outgoing connections take theirs while an engine starts
    (one took a routed plan's router metrics port: "already in use"), and a head derives its engines'
    and the router's metrics ports from its own (P + 1, P + 2)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low - count <= FIRST_PORT:
        raise EngineStartError(f"the ephemeral port range starts at {low}: no room below it for a server's ports")
    for _ in range(200):
        port = random.randrange(FIRST_PORT, low - count)
        run = range(port, port + count)
        if not _GIVEN.intersection(run) and all(bind_problem(host, p) is None for p in run):
            _GIVEN.update(run)
            return port
    raise EngineStartError(f"no {count} consecutive free ports below {low}")


def free_port(host: str = "127.0.0.1") -> int:
    """One free port on ``host`` below the kernel's ephemeral range (for engines and pages started by
    tune, the benchmarks and the tests)."""
    return free_run(1, host)


def log_tail(path: Path, n: int = 8) -> str:
    """The last ``n`` lines of a child's log, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no log)"


class ChildGroup:
    """A child process group: a vLLM server and its workers, the router, the chat page."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
        base_env: Mapping[str, str] | None = None,
        own_tmp: OwnTmp | None = None,
    ) -> None:
        """``env`` goes on top of ``base_env`` (default: this process's environment). ``own_tmp``:
        run from a temporary directory of its own (``child_tmp``), removed when it is stopped, by
        which a start after this process was killed finds the child and stops it."""
        self.argv = argv
        self.env = env
        self.base_env = base_env
        self.log_path = log_path
        self.cwd = cwd
        self.own_tmp = own_tmp
        self.tmp: ChildTmp | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        env = {**(os.environ if self.base_env is None else self.base_env), **self.env}
        if self.own_tmp:
            self.tmp = ChildTmp.create(self.own_tmp.role)
        try:
            if self.own_tmp and self.tmp:
                env.update(self.own_tmp.env(self.tmp.path))
            self.proc = self._spawn(env)
        except BaseException:
            self._remove_tmp()
            raise
        if self.tmp:
            self.tmp.record(self.proc.pid)

    def _spawn(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it from here
        try:
            return subprocess.Popen(
                self.argv,
                env={**env, "PYTHONUNBUFFERED": "1"},
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

    def named(self, name_prefix: str) -> list[int]:
        """This group's processes whose name (Linux keeps 15 characters) starts with ``name_prefix``."""
        if not self.proc:
            return []
        found = []
        for pid in group_processes(self.proc.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().startswith(name_prefix):
                    found.append(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue  # it exited meanwhile
        return found

    def lower_priority(self, name_prefix: str, nice: int) -> list[int]:
        """Renice every thread of this engine's processes whose name starts with ``name_prefix``
        (Linux nice is per thread; threads started later inherit it). Returns their pids."""
        found = []
        for pid in self.named(name_prefix):
            try:
                for task in Path(f"/proc/{pid}/task").iterdir():
                    os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
            except (FileNotFoundError, ProcessLookupError):
                continue  # it exited meanwhile
            found.append(pid)
        return found

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the whole group, then SIGKILL what is left after the grace period. Once its
        leader is reaped, its pid may be another process's: that one's group is left alone."""
        if self.proc and (self.proc.returncode is None or not alive(self.proc.pid)):
            stop_group(self.proc.pid, grace_s, self.proc.poll)
            self.proc.poll()
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        if self.tmp:
            self.tmp.remove()
            self.tmp = None
