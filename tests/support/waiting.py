"""Waiting on real services: a condition within a generous deadline, a process group gone."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

DEADLINE_S = 300.0
"""For anything that waits on an engine or the router: generous, a busy machine only slows it."""


def wait_until(what: str, check: Callable[[], object], timeout: float = DEADLINE_S, poll: float = 0.3) -> object:
    """``check()``'s first truthy value; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(poll)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def group_gone(pgid: int) -> bool:
    """No process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False
