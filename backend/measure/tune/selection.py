"""Choosing among measured candidates: the best for the objective, and the default against it.

The best: highest tokens/s among candidates whose p99 TTFT at the target concurrency meets
the objective; when none does, the lowest p99 TTFT. A candidate counts only when it started
and served every request at the target.
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.measure.stats import Level
from backend.measure.tune.records import CandidateRecord, DefaultVsBest

WITHIN = 0.05
"""The default counts as as good as the best when within 5 %."""


def usable(m: CandidateRecord) -> bool:
    """Started, and every request at the target concurrency succeeded."""
    t = m.target
    return m.ok and t is not None and t.errors == 0 and t.ok > 0 and t.ttft_p99_ms is not None


def _target(m: CandidateRecord) -> Level:
    assert m.target is not None, "only usable candidates are compared"
    return m.target


def _tps(m: CandidateRecord) -> float:
    return float(_target(m).output_tokens_per_s)


def _p99(m: CandidateRecord) -> float:
    return float(_target(m).ttft_p99_ms or 0.0)


def select_best(measured: Sequence[CandidateRecord], objective_ms: float | None) -> tuple[CandidateRecord | None, str]:
    """Highest tokens/s among those meeting the p99 TTFT objective; none meets it: lowest p99.

    Ties go to the earlier candidate (the default is first). Returns (best or None, why).
    """
    ok = [m for m in measured if usable(m)]
    if not ok:
        return None, "no candidate started and served every request"
    meeting = ok if objective_ms is None else [m for m in ok if _p99(m) <= objective_ms]
    if meeting:
        best = max(meeting, key=_tps)  # max keeps the first of equals
        bound = "no p99 TTFT objective" if objective_ms is None else f"p99 TTFT <= {objective_ms:g} ms"
        return best, f"highest tokens/s among {len(meeting)} of {len(ok)} candidates meeting {bound}"
    best = min(ok, key=_p99)
    return best, f"no candidate met p99 TTFT <= {objective_ms:g} ms; lowest p99 TTFT"


def compare_default(
    measured: Sequence[CandidateRecord], best: CandidateRecord | None, objective_ms: float | None
) -> DefaultVsBest:
    """The planner's default against the best: ratios, and whether the default is within 5 %."""
    default = next((m for m in measured if m.name == "default"), None)
    if default is None or best is None or not usable(default):
        return DefaultVsBest(default_measured=bool(default and usable(default)))
    any_met = objective_ms is None or _p99(best) <= objective_ms
    if any_met:
        default_meets = objective_ms is None or _p99(default) <= objective_ms
        within = default_meets and _tps(default) >= (1 - WITHIN) * _tps(best)
    else:
        within = _p99(default) <= (1 + WITHIN) * _p99(best)
    return DefaultVsBest(
        default_measured=True,
        best=best.name,
        tokens_per_s_best_over_default=round(_tps(best) / _tps(default), 3) if _tps(default) else None,
        p99_ttft_best_over_default=round(_p99(best) / _p99(default), 3) if _p99(default) else None,
        default_within_5pct=bool(within),
    )
