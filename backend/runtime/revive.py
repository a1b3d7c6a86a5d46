"""How often a dead engine is started again: at most ``engine.restart_limit`` times within
:data:`RESTART_WINDOW_S`, each after a longer pause, so an engine that dies at once on every start
(its GPU gone, its weights truncated) does not loop, while one killed now and then always returns."""

from __future__ import annotations

from dataclasses import dataclass, field

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
