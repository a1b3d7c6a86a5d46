"""Each child process group's own temporary directory (an engine's, the router's, the chat page's),
locked by the process that started it for as long as that process lives.

vLLM puts its ZeroMQ sockets (``VLLM_RPC_BASE_PATH``), its workers' rendezvous file
(``vllm_dist_*``) and Prometheus's multiprocess files in the temporary directory and leaves them
there: 7 socket files and one rendezvous file for each CPU engine start (3,090 and 428 after a day
of this project's runs). With ``TMPDIR`` pointing at a directory of the engine's own, they go there,
and stopping the engine removes it. Torch's compile cache keeps its usual place
(``TORCHINDUCTOR_CACHE_DIR``), so restarts still reuse it.

The directory also says whose child runs from it, so that a start killed with SIGKILL, whose children
live on in their own process groups, can be cleaned up after by the next (``leftovers``). Its name is
``erniechat-engine-<owner pid>-<random>`` (from when engines were the only children; kept, so that a
start finds an older version's too). Its owner holds a ``flock`` on it: the lock goes when the owner
goes, however it ends, and it tells the owner's life through a reused pid and from another PID
namespace (a container sharing /tmp, where the owner's pid means nothing). Inside: ``role`` (how
messages call the child) and ``pidns`` (the owner's PID namespace: a directory of another namespace's
is left to that namespace's starts, which alone can see its child), both written before it gets its
name, and ``engine.pgid`` (the child's process group, once it runs). An owner killed between starting
its child and writing that leaves a directory the next start removes, and a child it cannot find.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from backend.runtime.processes.groups import alive, group_processes, start_time
from config.settings import TMP_BASE_ENV

PREFIX = "erniechat-engine-"
"""``erniechat-engine-<owner pid>-<random>``"""
NEW_PREFIX = ".erniechat-new-"
"""A directory's name until its owner holds its lock: no start sees it unlocked under ``PREFIX``."""
NEW_ABANDONED_S = 60.0
"""A ``NEW_PREFIX`` directory unlocked for this long lost its owner while being made: removed."""
FOREIGN_ABANDONED_S = 86400.0
"""Another PID namespace's directory unlocked and untouched for this long: that namespace (a container
sharing /tmp) is most likely gone with its processes, and no start will ever match it: removed."""
OWNER_FILE = "engine.pgid"
"""The child's process group and when its leader started (``groups.start_time``), written once it
runs: a live child keeps its directory. An older version's holds the group only."""
ROLE_FILE = "role"
NS_FILE = "pidns"
UNKNOWN_ROLE = "an engine"
"""The role of a directory without ``ROLE_FILE`` (an older version's: engines only)."""


def children_base() -> Path:
    """Where children's directories are made and looked for: the starter's temporary directory, which
    each child gets as ``TMP_BASE_ENV`` (the chat page reads the status, which names a leftover engine,
    with a ``TMPDIR`` of its own, where it would find none); the system's when the variable names no
    directory (set by hand, or the starter's gone with it)."""
    base = os.environ.get(TMP_BASE_ENV)
    return Path(base) if base and os.path.isdir(base) else Path(tempfile.gettempdir())


def inductor_cache_dir() -> str:
    """Torch Inductor's cache where it would be without our ``TMPDIR`` (torch's own default rule)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def engine_tmp_env(tmp: Path) -> dict[str, str]:
    """An engine's environment for ``tmp``: temporary files and sockets there, compile cache as usual."""
    return {**tmpdir_env(tmp), "VLLM_RPC_BASE_PATH": str(tmp), "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir()}


def tmpdir_env(tmp: Path) -> dict[str, str]:
    """Any other child's environment for ``tmp``: its temporary files there."""
    return {"TMPDIR": str(tmp), TMP_BASE_ENV: str(tmp.parent)}


@dataclass(frozen=True)
class OwnTmp:
    """What a child gets a directory of its own for: how messages call it, and its environment there."""

    role: str
    env: Callable[[Path], dict[str, str]] = field(default=tmpdir_env)


class ChildTmp:
    """One child's directory, locked by this process until :meth:`remove`."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd = lock_fd

    @classmethod
    def create(cls, role: str, base: Path | None = None) -> ChildTmp:
        """A fresh directory, after removing those whose owners and children are gone. Made under a
        hidden name, locked, then renamed: no other start can take it for an orphan meanwhile."""
        base = base or children_base()
        remove_abandoned(base)
        new = Path(tempfile.mkdtemp(prefix=NEW_PREFIX, dir=base))
        fd = -1
        try:
            fd = os.open(new, os.O_RDONLY | os.O_DIRECTORY)  # not inherited: the child must not hold the lock
            fcntl.flock(fd, fcntl.LOCK_EX)
            (new / ROLE_FILE).write_text(role)
            (new / NS_FILE).write_text(pid_namespace())
            path = base / f"{PREFIX}{os.getpid()}-{new.name[len(NEW_PREFIX) :]}"
            os.rename(new, path)
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            if fd >= 0:
                os.close(fd)
            raise
        return cls(path, fd)

    def record(self, pgid: int) -> None:
        (self.path / OWNER_FILE).write_text(f"{pgid} {start_time(pgid) or ''}".strip())

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def pid_namespace() -> str:
    """This process's PID namespace (Linux), or "" where it cannot be told."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def locked(path: Path) -> bool:
    """Whether a process holds ``path``'s lock (its owner, alive: an exclusive ``flock``). Probing asks
    for a shared one, which other probes share: however many processes look at once (every chat page
    reads the status, which looks for a killed start's engine), none takes another's probe for an owner.
    Fails safe: a directory that cannot be opened, but is there, counts as locked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as err:
        return err.errno != errno.ELOOP  # a link is no directory of ours; anything else: cannot tell
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Orphan:
    """A child's directory of this user's whose owner is gone, and the child's process group (None
    when it never started)."""

    path: Path
    owner_pid: int
    pgid: int | None
    started: int | None
    """When the group's leader started, if recorded."""
    role: str


def orphans(base: Path) -> list[Orphan]:
    """This user's child directories in ``base`` whose owner is gone: nobody holds the lock (an older
    version's directory, which has none: and its owner's pid is not alive). Left to their own: another
    PID namespace's. Never through a link: another user could point one at a live child's directory."""
    found = []
    here = pid_namespace()
    for path in sorted(base.glob(f"{PREFIX}*")):
        owner = path.name[len(PREFIX) :].split("-", 1)[0]
        if not owned_directory(path) or not owner.isdigit():
            continue
        try:
            theirs: str | None = (path / NS_FILE).read_text()
        except FileNotFoundError:
            theirs = None  # an older version's
        except OSError:
            continue  # cannot tell whose
        if theirs is not None and theirs != here:
            continue
        try:
            role: str | None = (path / ROLE_FILE).read_text().strip()
        except FileNotFoundError:
            role = None  # an older version's: no lock either
        except OSError:
            role = ""
        if locked(path) or (role is None and alive(int(owner))):
            continue
        pgid, started = read_owner(path)
        found.append(Orphan(path, int(owner), pgid, started, role or UNKNOWN_ROLE))
    return found


def read_owner(path: Path) -> tuple[int | None, int | None]:
    """The child's process group and its leader's start time, from ``path``'s ``OWNER_FILE``."""
    try:
        numbers = [int(word) for word in (path / OWNER_FILE).read_text().split()[:2]]
    except (OSError, ValueError):
        return None, None
    return (numbers[0] if numbers else None), (numbers[1] if len(numbers) > 1 else None)


def owned_directory(path: Path) -> bool:
    """A real directory (not a link to one) of this user's."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def remove_abandoned(base: Path) -> list[Path]:
    """Remove child directories in ``base`` whose owner and child process group are both gone, half-made
    ones whose owner died making them, and another PID namespace's unlocked for a day."""
    removed = []
    here = pid_namespace()
    for path in [*base.glob(f"{NEW_PREFIX}*"), *base.glob(f"{PREFIX}*")]:
        try:
            age = time.time() - path.lstat().st_mtime
            foreign = path.name.startswith(PREFIX) and (path / NS_FILE).read_text() != here
        except OSError:
            continue  # gone meanwhile, or an older version's (no namespace): judged below
        limit = FOREIGN_ABANDONED_S if foreign else NEW_ABANDONED_S if path.name.startswith(NEW_PREFIX) else None
        if limit is not None and age > limit and owned_directory(path) and not locked(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    for orphan in orphans(base):
        if orphan.pgid is not None and group_processes(orphan.pgid, live=True):
            continue  # a child outliving its owner (killed with SIGKILL) still runs from here
        shutil.rmtree(orphan.path, ignore_errors=True)
        removed.append(orphan.path)
    return removed
