"""tune's choice of the best on recorded numbers, and the default against it; the records' JSON."""

from __future__ import annotations

import pytest

from backend.measure.stats import Level
from backend.measure.tune.records import CandidateRecord, DefaultVsBest
from backend.measure.tune.selection import compare_default, select_best


def rec(name: str, tps: float, p99: float, *, errors: int = 0, ok: bool = True) -> CandidateRecord:
    target = Level(concurrency=8, output_tokens_per_s=tps, ttft_p99_ms=p99, ttft_p50_ms=p99 / 2, errors=errors, ok=8)
    return CandidateRecord(name=name, pins={} if name == "default" else {"max_num_seqs": 99}, ok=ok, target=target)


RECORDED = [rec("default", 100, 300), rec("fast", 120, 500), rec("middle", 110, 350), rec("broken", 500, 10, errors=1)]


def test_best_is_the_fastest_meeting_the_objective() -> None:
    best, why = select_best(RECORDED, 400)
    assert best is not None and best.name == "middle"
    assert "2 of 3" in why
    best, _ = select_best(RECORDED, None)
    assert best is not None and best.name == "fast", "no objective: highest tokens/s"


def test_when_none_meets_the_objective_the_lowest_p99_wins() -> None:
    best, why = select_best(RECORDED, 100)
    assert best is not None and best.name == "default"
    assert "no candidate met" in why


def test_candidates_with_errors_or_no_start_never_win() -> None:
    failed = CandidateRecord(name="dead", ok=False, error="exited", pins={})
    assert select_best([RECORDED[3], failed], None)[0] is None
    best, _ = select_best([*RECORDED, failed], None)
    assert best is not None and best.name == "fast"


def test_ties_go_to_the_default() -> None:
    best, _ = select_best([rec("default", 100, 300), rec("same", 100, 300)], None)
    assert best is not None and best.name == "default"


def test_default_against_best() -> None:
    best, _ = select_best(RECORDED, 400)
    cmp = compare_default(RECORDED, best, 400)
    assert cmp.tokens_per_s_best_over_default == pytest.approx(1.1)
    assert cmp.p99_ttft_best_over_default == pytest.approx(350 / 300, abs=1e-3)
    assert cmp.default_within_5pct is False
    close = [rec("default", 106, 300), rec("middle", 110, 350)]
    best, _ = select_best(close, 400)
    assert compare_default(close, best, 400).default_within_5pct is True
    # The default misses the objective: not "as good", however fast.
    slow = [rec("default", 109, 450), rec("middle", 110, 350)]
    best, _ = select_best(slow, 400)
    assert compare_default(slow, best, 400).default_within_5pct is False


def test_records_dump_to_the_keys_tune_json_has_always_had() -> None:
    head = ["name", "pins", "changes", "values", "run_dir", "ok", "error"]
    failed = CandidateRecord(name="dead", error="exited", wall_s=3.0)
    assert list(failed.model_dump(mode="json")) == [*head, "wall_s"], "never started: no start-up or levels"
    started = rec("default", 100, 300).model_copy(update={"startup_s": 50.0, "single": None, "wall_s": 90.0})
    assert list(started.model_dump(mode="json")) == [*head, "startup_s", "startup", "target", "wall_s"]
    assert started.model_dump()["startup"] is None, "started: the start-up record is kept, null or not"
    assert compare_default([failed], None, None).model_dump() == {
        "default_measured": False,
        "default_within_5pct": False,
    }
    best, _ = select_best(RECORDED, 400)
    assert list(compare_default(RECORDED, best, 400).model_dump()) == list(DefaultVsBest.model_fields)
