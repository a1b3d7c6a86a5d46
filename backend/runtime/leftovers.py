"""Engines a killed ``serve`` left running, stopped by the next start.

``serve`` runs each engine in a process group of its own and stops them on Ctrl-C or SIGTERM. A
``serve`` killed with SIGKILL (a CI job's timeout, an OOM kill, a dropped session's cleanup) leaves
them running, holding their port and, on a GPU, their memory. Nothing reaches them any more: no
router, no status. vLLM's API servers bind with SO_REUSEPORT when there are several, so a new engine
on the same port started beside the old one, and the kernel split the connections between them: on
an H200 the new engine's warm-up went to a left-over engine whose GPU was gone, and hung (BENCHMARKS,
"An engine left running by a killed serve").

Such an engine is known by its temporary directory (``engine_tmp``): its ``serve`` is gone, its
process group is alive, and a process of that group runs with that directory as its ``TMPDIR``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from backend.runtime.engine_tmp import orphans, remove_abandoned
from backend.runtime.process import group_processes, stop_group


@dataclass(frozen=True)
class Leftover:
    """An engine whose ``serve`` is gone: its process group and the pid of that ``serve``."""

    pgid: int
    serve_pid: int


def find_leftovers(base: Path) -> list[Leftover]:
    """Engines in ``base`` (the temporary directory) whose ``serve`` is gone and which still run there."""
    return [Leftover(o.pgid, o.serve_pid) for o in orphans(base) if o.pgid is not None and runs_from(o.pgid, o.path)]


def runs_from(pgid: int, tmp: Path) -> bool:
    """True when a live process of group ``pgid`` has ``tmp`` as its ``TMPDIR``: that engine's own
    directory, so a reused group id is never taken for an engine."""
    wanted = b"TMPDIR=" + bytes(tmp)
    for pid in group_processes(pgid, live=True):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            return True
    return False


def stop_leftovers(base: Path | None = None, grace_s: float = 15.0) -> list[Leftover]:
    """Stop every engine a killed ``serve`` left running, then remove their directories."""
    base = base or Path(tempfile.gettempdir())
    found = find_leftovers(base)
    for leftover in found:
        stop_group(leftover.pgid, grace_s)
    if found:
        remove_abandoned(base)
    return found
