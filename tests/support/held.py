"""Hold a reply in place, so that tests about stopping it do not race the engine's speed.

``held(engine)`` stops vLLM's engine-core process (SIGSTOP): the request stays running, no
token is generated, and the page's HTTP stream to the engine stays open until the page
closes it. ``open_streams(pid, port)`` counts that process's established TCP connections to
the engine's port (``/proc``), so a test sees exactly when the page let go of a reply. Once
resumed (SIGCONT), the engine either finishes the reply (nobody closed it) or aborts it.
``Hold.step`` lets it run for a moment only: a test that needs a reply streaming before it holds
it starts held and steps, so the reply cannot run to its end while a busy machine delays the page.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from backend.runtime.components.engines import ENGINE_CORE_TITLE
from backend.runtime.processes.groups import group_processes
from backend.runtime.status import read_status

ESTABLISHED = "01"


def engine_core_pids(run_dir: Path) -> list[int]:
    status = read_status(run_dir)
    assert status is not None and status.engine_pid, "no engine in this run dir"
    pids = [p for p in group_processes(status.engine_pid) if _comm(p).startswith(ENGINE_CORE_TITLE)]
    assert pids, f"no {ENGINE_CORE_TITLE} process in the engine's group"
    return pids


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return ""


@dataclass(frozen=True)
class Hold:
    """The stopped engine-core processes of one ``held`` block."""

    pids: list[int]

    def _signal(self, sig: signal.Signals) -> None:
        for pid in self.pids:
            os.kill(pid, sig)

    def step(self, seconds: float) -> None:
        """Let the engine run for ``seconds`` (a few tokens), then stop it again."""
        self._signal(signal.SIGCONT)
        try:
            time.sleep(seconds)
        finally:
            self._signal(signal.SIGSTOP)


@contextmanager
def held(run_dir: Path) -> Iterator[Hold]:
    """The engine core stopped for the block's duration; resumed on the way out, always."""
    hold = Hold(engine_core_pids(run_dir))
    hold._signal(signal.SIGSTOP)
    try:
        yield hold
    finally:
        hold._signal(signal.SIGCONT)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def open_streams(pid: int, port: int, *, accepted: bool = False) -> int:
    """Established TCP connections from process ``pid`` to ``port`` on this machine; with
    ``accepted``, those ``pid`` serves on its own ``port`` instead."""
    inodes = _socket_inodes(pid)
    side = 1 if accepted else 2
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[side].rsplit(":", 1)[1], 16) == port and fields[3] == ESTABLISHED and fields[9] in inodes:
                n += 1
    return n


def wait_for_streams(pid: int, port: int, want: int, bound_s: float = 120.0) -> float:
    """Seconds until ``pid`` holds exactly ``want`` streams to ``port``; fails after ``bound_s``
    (a bound against hanging, not a measurement)."""
    t0 = time.monotonic()
    while (n := open_streams(pid, port)) != want:
        assert time.monotonic() - t0 < bound_s, f"{n} streams to :{port} after {bound_s:.0f} s, expected {want}"
        time.sleep(0.05)
    return time.monotonic() - t0
