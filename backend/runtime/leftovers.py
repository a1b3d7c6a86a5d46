"""Engines a killed ``serve`` left running, stopped by the next start.

``serve`` runs each engine in a process group of its own and stops them on Ctrl-C or SIGTERM. A
``serve`` killed with SIGKILL (a CI job's timeout, an OOM kill, a dropped session's cleanup) leaves
them running, holding their port and, on a GPU, their memory. Nothing reaches them any more: no
router, no status. vLLM's API servers bind with SO_REUSEPORT when there are several, so a new engine
on the same port started beside the old one, and the kernel split the connections between them: on
an H200 the new engine's warm-up went to a left-over engine whose GPU was gone, and hung (BENCHMARKS,
"An engine left running by a killed serve").

Such an engine is known by its temporary directory (``engine_tmp``): its ``serve`` is gone, its
process group is alive, and that group runs vLLM.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from backend.runtime.engine_tmp import OWNER_FILE, PREFIX, alive, remove_abandoned
from backend.runtime.process import group_processes, stop_group


@dataclass(frozen=True)
class Leftover:
    """An engine whose ``serve`` is gone: its process group and the pid of that ``serve``."""

    pgid: int
    serve_pid: int


def find_leftovers(base: Path | None = None) -> list[Leftover]:
    """Engines in ``base`` (the temporary directory) whose ``serve`` is gone and which still run vLLM."""
    found = []
    for path in sorted((base or Path(tempfile.gettempdir())).glob(f"{PREFIX}*")):
        serve_pid = path.name[len(PREFIX) :].split("-", 1)[0]
        try:
            if path.stat().st_uid != os.getuid():
                continue  # another user's engine is theirs to stop
            pgid = int((path / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if serve_pid.isdigit() and not alive(int(serve_pid)) and runs_vllm(pgid):
            found.append(Leftover(pgid, int(serve_pid)))
    return found


def runs_vllm(pgid: int) -> bool:
    """True when process group ``pgid`` is alive and one of its processes is vLLM's (its command
    line or title), so that a reused group id is never taken for an engine."""
    for pid in group_processes(pgid, live=True):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"vllm" in cmdline.lower():
            return True
    return False


def stop_leftovers(base: Path | None = None, grace_s: float = 15.0) -> list[Leftover]:
    """Stop every engine a killed ``serve`` left running, then remove their directories."""
    found = find_leftovers(base)
    for leftover in found:
        stop_group(leftover.pgid, grace_s)
    if found:
        remove_abandoned(base or Path(tempfile.gettempdir()))
    return found
