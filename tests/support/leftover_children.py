"""A stand-in for a start killed with SIGKILL: a process that starts children the way ``serve`` does
(each in its own process group, from its own locked temporary directory), then waits to be killed.
Each child writes when it got SIGTERM (``<i>.term`` in ``out``) and goes on: only SIGKILL ends it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from support.services import ROOT

STARTER = """
import sys, time
from pathlib import Path
from backend.runtime.processes.child_tmp import OwnTmp
from backend.runtime.processes.process import ChildGroup
out = Path(sys.argv[1])
child = (
    "import signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'w').write(repr(time.monotonic())))\\n"
    "while True: time.sleep(1)\\n"
)
kids = [
    ChildGroup([sys.executable, "-c", child, str(out / f"{i}.term")], {}, out / f"{i}.log", out, own_tmp=own)
    for i, own in enumerate(map(OwnTmp, sys.argv[2:]))
]
for kid in kids:
    kid.start()
print(" ".join(str(kid.pid) for kid in kids), flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def children_started(out: Path, tmp_base: Path, roles: list[str]) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """The starter (its temporary directory ``tmp_base``) and its children's process groups, one per
    role, all running; whatever is left is killed afterwards."""
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(out), *roles],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_base)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    groups: list[int] = []
    try:
        assert starter.stdout
        groups = [int(word) for word in starter.stdout.readline().split()]
        assert len(groups) == len(roles), "the starter did not start its children"
        yield starter, groups
    finally:
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        starter.kill()
        starter.wait()
