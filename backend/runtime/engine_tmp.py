"""Each engine's own temporary directory, so that a stopped engine leaves nothing in /tmp.

vLLM puts its ZeroMQ sockets (``VLLM_RPC_BASE_PATH``), its workers' rendezvous file
(``vllm_dist_*``) and Prometheus's multiprocess files in the temporary directory and leaves them
there: 7 socket files and one rendezvous file for each CPU engine start (3,090 and 428 after a day
of this project's runs). With ``TMPDIR`` pointing at a directory of the engine's own, they go there,
and ``Engine.stop`` removes it. Torch's compile cache keeps its usual place (``TORCHINDUCTOR_CACHE_DIR``),
so restarts still reuse it. A directory left by a killed ``serve`` is removed by the next start,
once neither that ``serve`` nor its engine's process group is alive.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from backend.runtime.process import group_processes

PREFIX = "erniechat-engine-"
"""``erniechat-engine-<serve pid>-<random>``"""
OWNER_FILE = "engine.pgid"
"""The engine's process group, written once it runs: a live engine keeps its directory."""


def inductor_cache_dir() -> str:
    """Torch Inductor's cache where it would be without our ``TMPDIR`` (torch's own default rule)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def make_engine_tmp() -> Path:
    """A fresh directory for one engine process, after removing those whose owners are gone."""
    base = Path(tempfile.gettempdir())
    remove_abandoned(base)
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))


def engine_tmp_env(tmp: Path) -> dict[str, str]:
    """The engine's environment for ``tmp``: temporary files and sockets there, compile cache as usual."""
    return {"TMPDIR": str(tmp), "VLLM_RPC_BASE_PATH": str(tmp), "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir()}


def record_owner(tmp: Path, pgid: int) -> None:
    (tmp / OWNER_FILE).write_text(str(pgid))


@dataclass(frozen=True)
class Orphan:
    """An engine directory of this user's whose ``serve`` is gone, and the engine's process group
    (None when the engine never started)."""

    path: Path
    serve_pid: int
    pgid: int | None


def orphans(base: Path) -> list[Orphan]:
    """This user's engine directories in ``base`` whose ``serve`` is gone. Never through a link:
    another user could point one at a live engine's directory."""
    found = []
    for path in sorted(base.glob(f"{PREFIX}*")):
        serve_pid = path.name[len(PREFIX) :].split("-", 1)[0]
        try:
            info = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or not serve_pid.isdigit():
            continue
        if alive(int(serve_pid)):
            continue
        try:
            pgid: int | None = int((path / OWNER_FILE).read_text())
        except (OSError, ValueError):
            pgid = None
        found.append(Orphan(path, int(serve_pid), pgid))
    return found


def remove_abandoned(base: Path) -> list[Path]:
    """Remove engine directories in ``base`` whose ``serve`` and engine process group are both gone."""
    removed = []
    for orphan in orphans(base):
        if orphan.pgid is not None and group_processes(orphan.pgid, live=True):
            continue  # an engine outliving its serve (killed with SIGKILL) still runs from here
        shutil.rmtree(orphan.path, ignore_errors=True)
        removed.append(orphan.path)
    return removed


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists; another user's counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True
