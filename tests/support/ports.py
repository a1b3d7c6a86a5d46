"""Test ports for servers that take a run of them (a routed ``serve`` on P: router P, engines P + 1 ..,
router metrics after them), drawn below the kernel's ephemeral range, where no outgoing
connection takes one while the engines start."""

from __future__ import annotations

import random
import socket
from contextlib import closing
from pathlib import Path

FIRST_PORT = 10000
"""Test ports are drawn from here up to the start of the kernel's ephemeral range."""


_GIVEN: set[int] = set()
"""Ports handed out in this process: two runs drawn for one test (a head's and its master port) are
free when drawn but not yet held, so a second draw could overlap the first."""


def free_run(count: int) -> int:
    """A port P with P .. P + count - 1 free, below the kernel's ephemeral range: the head derives
    its engines' and the router's metrics ports from its own (P + 1, P + 2), and a port the kernel
    handed out for a free one lies where outgoing connections take theirs while the engines start
    (one took P + 2 in a fresh-clone run: "router metrics port ... already in use")."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low - count <= FIRST_PORT:
        raise RuntimeError(f"the ephemeral port range starts at {low}: no room below it for test ports")
    for _ in range(200):
        port = random.randrange(FIRST_PORT, low - count)
        run = range(port, port + count)
        if not _GIVEN.intersection(run) and all(_free(p) for p in run):
            _GIVEN.update(run)
            return port
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


def free_port() -> int:
    """One free port below the kernel's ephemeral range, for a server a test starts: one the kernel
    hands out for a free one may be taken by an outgoing connection before the server listens."""
    return free_run(1)


def _free(port: int) -> bool:
    with closing(socket.socket()) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
