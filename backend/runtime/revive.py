"""How often what died is started again: at most ``engine.restart_limit`` times within
:data:`RESTART_WINDOW_S`, each after a longer pause, so an engine that dies at once on every start
(its GPU gone, its weights truncated) does not loop, while one killed now and then always returns.
:func:`bring_back` is the one restart loop: the keeper's for engines and the router, ``up``'s for the
chat page."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import httpx

from backend.errors import ErniechatError

RESTART_WINDOW_S = 600.0
"""Restarts older than this no longer count against the limit."""
PAUSES_S = (0.0, 5.0, 20.0, 60.0)
"""The pause before the first, second, ... restart within the window (the last one repeats)."""


@dataclass
class RestartBudget:
    """One engine's restarts within the window."""

    limit: int
    window_s: float = RESTART_WINDOW_S
    times: list[float] = field(default_factory=list)

    def next_pause(self, now: float) -> float | None:
        """Seconds to wait before restarting now (and counts it); None once ``limit`` restarts fall
        within the window."""
        self.times = [t for t in self.times if now - t < self.window_s]
        if len(self.times) >= self.limit:
            return None
        pause = PAUSES_S[min(len(self.times), len(PAUSES_S) - 1)]
        self.times.append(now + pause)
        return pause

    @property
    def used(self) -> int:
        """Restarts within the window, the one under way included."""
        return len(self.times)

    def exhausted_text(self) -> str:
        """Why there is no next restart."""
        if self.limit == 0:
            return "not restarted (engine.restart_limit is 0)"
        minutes = self.window_s / 60
        return f"restarted {self.limit} times within {minutes:.0f} minutes (engine.restart_limit), not again"


@dataclass(frozen=True)
class Revival:
    """One thing to start again, as :func:`bring_back` drives it."""

    label: str
    why: str
    """Why it is being restarted (its exit), for the first message."""
    relaunch: Callable[[], None]
    """A fresh process."""
    until_back: Callable[[], None]
    """Returns once it serves again; raises when it did not come back."""
    back: Callable[[int], None]
    """It serves again (the restarts within the window)."""
    give_up: Callable[[str], None]
    """Its restarts are spent (why)."""
    announce: Callable[[str], None] = lambda text: None
    """Shows "restarting it" where the run's state is kept."""


def never() -> bool:
    return False


def bring_back(
    what: Revival,
    budget: RestartBudget,
    say: Callable[[str], None],
    stopped: Callable[[], bool] = never,
    lifecycle: threading.Lock | None = None,
) -> None:
    """Restart ``what`` until it is back or its restarts are spent, each after the budget's pause, said
    at each step; nothing more once ``stopped()``. ``lifecycle``: held while it is relaunched, so that a
    stop either comes first (no process started) or stops this one."""
    why = what.why
    while not stopped():
        pause = budget.next_pause(time.monotonic())
        if pause is None:
            what.give_up(f"{why}; {budget.exhausted_text()}")
            return
        after = f" in {pause:.0f} s" if pause else ""
        what.announce(f"{why}; restarting it{after} ({budget.used} of {budget.limit})")
        say(f"note: {why}; restarting it{after} (restart {budget.used} of {budget.limit} within 10 min)")
        deadline = time.monotonic() + pause
        while not stopped() and time.monotonic() < deadline:
            time.sleep(min(0.2, deadline - time.monotonic()))
        with lifecycle or nullcontext():
            if stopped():
                return
            what.relaunch()
        try:
            what.until_back()
        except (ErniechatError, httpx.HTTPError) as err:
            why = f"{what.label} did not come back ({str(err).splitlines()[0]})"
            continue
        if not stopped():
            what.back(budget.used)
        return
