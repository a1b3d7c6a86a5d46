"""What ``tune`` records: one measured candidate, the default against the best, and tune.json.

Each model dumps to the keys ``tune.json`` and the tuned profile's ``measurements`` have
always had: a figure that was never taken (a candidate that did not start has no
``startup_s``, ``target`` or ``single``) is absent, not null.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, model_serializer

from backend.measure.stats import Level
from backend.prompts import Shape
from backend.runtime.status import StartupRecord
from config.performance.prediction import Prediction


def _drop_absent(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if not (k in keys and v is None)}


class CandidateRecord(BaseModel):
    """One candidate as measured: its engine's start-up, then a level at the target and at 1."""

    name: str
    pins: dict[str, Any] = {}
    changes: list[str] = []
    values: dict[str, Any] = {}
    """The plan values (TP, PP, DP, max_num_seqs, ...) the engine ran with."""
    run_dir: str = ""
    ok: bool = False
    error: str | None = None
    startup_s: float | None = None
    """Launch to ready, warm-up included; None: the engine did not start."""
    startup: StartupRecord | None = None
    """Where the start's seconds went, as the status file records them."""
    note: str | None = None
    target: Level | None = None
    """The level at the target concurrency (what the best is chosen on)."""
    single: Level | None = None
    """The level at concurrency 1 (reported beside it)."""
    wall_s: float | None = None
    """The candidate's whole time: start, warm-up, both levels, stop."""
    predicted: Prediction | None = None
    """The performance model's figures at the target concurrency (what ranked it)."""

    @property
    def prediction_error_pct(self) -> dict[str, float] | None:
        """(predicted / measured - 1) x 100 at the target: tokens/s, TTFT p50 and p99."""
        p, m = self.predicted, self.target
        if p is None or m is None or not m.output_tokens_per_s or not m.ttft_p50_ms or not m.ttft_p99_ms:
            return None
        pairs = (
            ("output_tokens_per_s", p.output_tokens_per_s.point, m.output_tokens_per_s),
            ("ttft_p50_ms", p.ttft_p50_ms.point, m.ttft_p50_ms),
            ("ttft_p99_ms", p.ttft_p99_ms.point, m.ttft_p99_ms),
        )
        return {key: round((ours / theirs - 1) * 100, 1) for key, ours, theirs in pairs}

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.startup_s is None:
            data.pop("startup", None)
        data["prediction_error_pct"] = self.prediction_error_pct
        return _drop_absent(
            data, ("startup_s", "note", "target", "single", "wall_s", "predicted", "prediction_error_pct")
        )


class DefaultVsBest(BaseModel):
    """The planner's default against the best: ratios, and whether the default is within 5 %."""

    default_measured: bool
    best: str | None = None
    tokens_per_s_best_over_default: float | None = None
    p99_ttft_best_over_default: float | None = None
    default_within_5pct: bool = False

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.best is None:  # nothing compared: the two flags only
            return {"default_measured": data["default_measured"], "default_within_5pct": data["default_within_5pct"]}
        return data


class TuneReport(BaseModel):
    """``tune.json``: the run's load, the candidates chosen and measured, the best and why."""

    started_at: str
    finished_at: str
    duration_s: float
    partial: bool
    """True while candidates remain: a run cut short still leaves what it measured."""
    hardware: str
    model: str
    served_name: str
    objective: str
    objective_ms: float | None
    concurrency: int
    requests: int
    max_tokens: int
    prompt_mix: dict[str, Shape] | None
    user_pins: dict[str, Any]
    candidates_valid: int
    chosen: list[dict[str, Any]]
    """name, pins and values of each candidate chosen to run, in order."""
    refused: list[str]
    skipped: list[str]
    """Chosen candidates the time budget left out."""
    ranked_out: int = 0
    """Valid candidates not chosen: predicted below the chosen (``ranking``)."""
    predicted_with: str = ""
    """Where the predictions' host costs came from."""
    measured: list[CandidateRecord]
    best: str | None
    why: str
    default_vs_best: DefaultVsBest
    profile: str | None = None
    """The tuned profile written (absent when no candidate won)."""

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any) -> dict[str, Any]:
        return _drop_absent(handler(self), ("profile",))
