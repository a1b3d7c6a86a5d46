"""Process groups as Linux's /proc shows them: which processes a group holds, stopping one.

Every child this project starts (an engine, the router, the chat page) runs in a process group of
its own, so that one signal reaches every process it spawned.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path


def _stat(path: Path) -> list[str]:
    """A /proc/PID/stat's fields after the process name (which may hold spaces and parentheses):
    state, ppid, pgrp, ... (``man 5 proc``: fields 3 onwards)."""
    return path.read_text().rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot): with the pid, it names one process for
    good, where a pid alone may be reused. None when there is no such process."""
    try:
        return int(_stat(Path(f"/proc/{pid}/stat"))[19])
    except (OSError, IndexError, ValueError):
        return None


def running(pid: int | None) -> bool:
    """Whether process ``pid`` runs: it exists and is no zombie (dead, its exit not yet collected)."""
    if not pid:
        return False
    try:
        return _stat(Path(f"/proc/{pid}/stat"))[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for_exit(pids: list[int], timeout_s: float) -> None:
    """Until one of ``pids`` that runs now exits, or ``timeout_s``: at once, through Linux pidfds (a plain
    sleep where there are none). Zombies are left out: their exit is already there to be collected."""
    fds = []
    try:
        for pid in pids:
            if running(pid):
                with contextlib.suppress(OSError):
                    fds.append(os.pidfd_open(pid))
        if not fds:
            time.sleep(timeout_s)
            return
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(timeout_s * 1000)
    finally:
        for fd in fds:
            os.close(fd)


def group_processes(pgid: int, live: bool = False) -> list[int]:
    """Pids in process group ``pgid`` (Linux /proc; empty elsewhere); ``live``: leaving out zombies,
    which a group keeps until someone reaps them (init may not, in a container)."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = _stat(entry)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == pgid and not (live and fields[0] == "Z"):  # after the name: state, ppid, pgrp
            pids.append(int(entry.parent.name))
    return sorted(pids)


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


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists; another user's counts as alive."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True
