"""Waiting on real services: a condition within a generous deadline, a process group gone."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

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


async def until_async(
    what: str,
    read: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    timeout: float = DEADLINE_S,
    poll: float = 0.1,
) -> T:
    """The first value of ``await read()`` that ``done`` accepts; AssertionError naming ``what``
    after ``timeout`` (a counter that never moves fails the test instead of hanging it)."""
    deadline = time.monotonic() + timeout
    while not done(got := await read()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what} (last: {got})")
        await asyncio.sleep(poll)
    return got


def group_gone(pgid: int) -> bool:
    """No process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False
