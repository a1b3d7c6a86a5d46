"""How long the next candidate will take, from those ``tune`` measured so far (its time budget)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spent:
    """One measured candidate's time: all of it, its start-up, and the engines it started."""

    wall_s: float
    startup_s: float | None
    engines: int

    @property
    def start_s(self) -> float:
        """Its start-up; all of it when the start failed (no start-up measured)."""
        return self.wall_s if self.startup_s is None else self.startup_s


def candidate_estimate(spent: Sequence[Spent], engines: int) -> float:
    """Seconds a candidate of ``engines`` engines will take, from those measured so far.

    The default always runs; another starts only when elapsed + this fits the budget. Start-up is
    scaled with the engine count: exact for engines that start one after another (sharing a GPU whose
    memory each measures), an upper bound where they start together (CPU, fixed KV cache); the
    fastest start per engine seen is used, since the first candidate also pays the cold caches (on
    one H200: 205 s to up for two engines cold, 126 s warm, 65 s for one warm engine). Measuring
    and stopping: the mean.
    """
    per_engine = min(s.start_s / max(s.engines, 1) for s in spent)
    rest = sum(s.wall_s - s.start_s for s in spent) / len(spent)
    return per_engine * engines + max(rest, 0.0)
