"""Which candidates ``tune`` measures: the performance model predicts each at the target load, and the best
predicted are measured (the planner's default always, first); the rest are skipped and counted.

Best: the highest predicted tokens/s among those whose predicted p99 TTFT meets the objective (all, without
one). Predictions within ``SAME`` of each other count as equal, and then the order of ``order_candidates``
decides (changes that can show at this load, single changes before combinations).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from backend.measure.tune.candidates import Candidate, order_candidates
from config.hardware import Hardware
from config.model import ModelSpec
from config.performance.costs import HostCosts
from config.performance.layout import layout_of
from config.performance.prediction import Load, Prediction, predict_point

SAME = 0.02
"""Predicted tokens/s this close (2 %) rank as equal."""


@dataclass
class Ranked:
    """The candidates to measure, in order, and what the model predicted for every candidate."""

    chosen: list[Candidate]
    predicted: dict[str, Prediction]
    skipped: int
    """Valid candidates not measured: predicted below the chosen."""


def rank(
    candidates: Sequence[Candidate],
    hardware: Hardware,
    model: ModelSpec,
    load: Load,
    costs: HostCosts,
    *,
    k: int,
    objective: str,
    objective_ms: float | None,
    long_prompt_tokens: int,
) -> Ranked:
    """The default and the k-1 best predicted others."""
    if not candidates:
        return Ranked([], {}, 0)
    predicted = {c.name: predict_point(layout_of(c.plan, hardware), model, load, costs) for c in candidates}
    order = order_candidates(candidates, len(candidates), objective, load.users, long_prompt_tokens)
    place = {c.name: i for i, c in enumerate(order)}

    def key(c: Candidate) -> tuple[bool, float, int]:
        p = predicted[c.name]
        misses = objective_ms is not None and p.ttft_p99_ms.point > objective_ms
        bucket = -math.floor(math.log(max(p.output_tokens_per_s.point, 1e-9)) / math.log1p(SAME))
        return misses, bucket, place[c.name]

    default, rest = candidates[0], sorted(candidates[1:], key=key)
    chosen = [default, *rest[: max(0, k - 1)]]
    return Ranked(chosen, predicted, len(candidates) - len(chosen))
