"""A throwaway Postgres cluster (Debian's ``postgresql``) for the chat store's tests.

Postgres refuses to run as root, and the suite runs as root in CI: the cluster is made and run by
the user ``nobody`` there (``runuser``), by the current user otherwise. It listens on 127.0.0.1 at a
free port, with ``trust`` login for its one role, and is removed when stopped.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from support.ports import free_port

ROLE = "erniechat"


def postgres_bin() -> Path:
    """The newest installed server's programs (``/usr/lib/postgresql/<version>/bin``)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    assert found, "Debian's postgresql is not installed: bash scripts/setup.sh --test installs it"
    return Path(found[-1]).parent


class Postgres:
    """``start()``, then ``url`` (SQLAlchemy form without driver: ``postgresql://...``); ``stop()``
    and ``start()`` again keep the data; ``remove()`` stops and deletes it."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.home = Path(tempfile.mkdtemp(prefix="erniechat-pg-"))  # under /tmp: reachable by nobody
        self.data = self.home / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.home, "nobody")
        self._run(["initdb", "-D", str(self.data), "-U", ROLE, "--auth=trust", "-E", "UTF8"])

    @property
    def url(self) -> str:
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/postgres"

    def _run(self, argv: list[str]) -> None:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", "nobody", "--", *cmd]
        done = subprocess.run(cmd, cwd=self.home, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"

    def start(self) -> Postgres:
        options = f"-p {self.port} -k {self.home} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(["pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.home / "log"), "-w", "start"])
        return self

    def stop(self) -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
