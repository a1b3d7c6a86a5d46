"""Children a killed start left running (engines, the router, the chat page), stopped by the next.

``serve`` and ``up`` run each child in a process group of its own and stop them on Ctrl-C or
SIGTERM. One killed with SIGKILL (a CI job's timeout, an OOM kill, a dropped session's cleanup)
leaves them running, holding their ports and, on a GPU, their memory. Nothing reaches them any more:
no router, no status. vLLM's API servers bind with SO_REUSEPORT when there are several, so a new
engine on the same port started beside the old one, and the kernel split the connections between
them: on an H200 the new engine's warm-up went to a left-over engine whose GPU was gone, and hung
(BENCHMARKS, "An engine left running by a killed serve"). A left-over router or page held its port,
and the next start stopped at "port in use".

Such a child is known by its temporary directory (``child_tmp``): its owner is gone, and its process
group still runs: its leader is the process that started then, or (an older version's directory, or
a leader gone before its group) a process of that group runs with that directory as its ``TMPDIR``.
Either way a reused group id is never taken for the child. (``TMPDIR`` alone is not enough: the
router, like any program that sets its process title, writes over its environment.)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from backend.runtime.processes.child_tmp import Orphan, children_base, orphans, remove_abandoned
from backend.runtime.processes.groups import group_processes, start_time, stop_group


@dataclass(frozen=True)
class Leftover:
    """A child whose owner is gone: its process group, the pid of that owner, and what it is."""

    pgid: int
    owner_pid: int
    role: str

    def stopped(self) -> str:
        return f"stopped {self.role} left running by a killed start (pid {self.owner_pid}, process group {self.pgid})"


def find_leftovers(base: Path | None = None) -> list[Leftover]:
    """Children in ``base`` (the temporary directory) whose owner is gone and which still run there."""
    base = base or children_base()
    return [Leftover(o.pgid, o.owner_pid, o.role) for o in orphans(base) if o.pgid is not None and still_runs(o)]


def still_runs(orphan: Orphan) -> bool:
    """Whether the orphan's child still runs (see the module's docstring for how it is told)."""
    if orphan.pgid is None:
        return False
    now = start_time(orphan.pgid)
    if orphan.started is not None and now is not None:  # its leader (perhaps a zombie) or a reused id's
        return now == orphan.started and bool(group_processes(orphan.pgid, live=True))
    return runs_from(orphan.pgid, orphan.path)


def runs_from(pgid: int, tmp: Path) -> bool:
    """True when a live process of group ``pgid`` has ``tmp`` as its ``TMPDIR``."""
    wanted = b"TMPDIR=" + bytes(tmp)
    for pid in group_processes(pgid, live=True):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            return True
    return False


def stop_leftovers(
    base: Path | None = None, grace_s: float = 15.0, found: list[Leftover] | None = None
) -> list[Leftover]:
    """Stop every child a killed start left running (``found``: as :func:`find_leftovers` just found
    them), all at once, then remove their directories."""
    base = base or children_base()
    found = find_leftovers(base) if found is None else found
    if found:
        with ThreadPoolExecutor(max_workers=len(found)) as pool:
            list(pool.map(lambda left: stop_group(left.pgid, grace_s), found))
        remove_abandoned(base)
    return found
