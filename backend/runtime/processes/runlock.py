"""One start per run directory and per port: a second ``serve`` or ``up`` is refused, naming the pid
of the running one, before it starts anything or writes any file of the first one's.

vLLM binds its port late (after loading the weights), so two starts a few seconds apart both passed
the port check, both engines came up, and the second's stop wrote ``stopped`` over the first's
status. An advisory lock (``flock``) on a file in the run directory, and one per port in the
temporary directory, held for the life of the start, ends that. The kernel drops a lock when its
process dies, so a start killed with SIGKILL never blocks the next one.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from backend.errors import RunBusy
from backend.runtime.processes.child_tmp import children_base

LOCK_FILE = "serve.lock"


def port_lock_path(port: int) -> Path:
    """The lock of one port, shared by every run directory on this machine."""
    return children_base() / f"erniechat-port-{port}.lock"


@dataclass(frozen=True)
class Claim:
    """One thing a start holds alone: its lock file, and how a refusal names it."""

    path: Path
    what: str
    fix: str


def claims_for(run_dir: Path, ports: Sequence[tuple[int, str]]) -> list[Claim]:
    """The run directory, then each ``(port, flag that moves it)``."""
    out = [Claim(run_dir / LOCK_FILE, f"the run directory {run_dir}", "or set another engine.run_dir")]
    return out + [port_claim(port, flag) for port, flag in ports]


def port_claim(port: int, flag: str) -> Claim:
    """A port, and the flag that moves it."""
    return Claim(port_lock_path(port), f"port {port}", f"or choose another {flag}")


class RunLock:
    """The claims of one start, held until :meth:`release` (or the process's end)."""

    def __init__(self, claims: Sequence[Claim]) -> None:
        self.claims = list(claims)
        self._held: list[IO[str]] = []

    @property
    def held(self) -> bool:
        return bool(self._held)

    def acquire(self) -> None:
        """Take every claim, or none: :class:`RunBusy` names the first one held elsewhere and its pid."""
        try:
            for claim in self.claims:
                self._take(claim)
        except BaseException:
            self.release()
            raise

    def _take(self, claim: Claim) -> None:
        claim.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(claim.path, "a+", encoding="utf-8")  # noqa: SIM115 (held open for the start's life)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = _holder(f.read())
            f.close()
            raise RunBusy(
                f"another start is running on {claim.what}{holder}: stop it first (Ctrl-C where it runs) "
                f"{claim.fix}; nothing was started"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid()}))
        f.flush()
        self._held.append(f)

    def release(self) -> None:
        for f in self._held:
            f.close()  # closing drops the lock; the file stays, empty of meaning
        self._held = []


def _holder(text: str) -> str:
    """`` (pid N)`` from a lock file's content; empty when unreadable (a start between lock and write)."""
    try:
        pid = int(json.loads(text)["pid"])
    except (ValueError, KeyError, TypeError):
        return ""
    return f" (pid {pid})"
