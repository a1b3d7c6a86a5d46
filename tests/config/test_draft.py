"""The rules hand values to each other through the draft by name: every name must be a field of
``Plan``, or the value is lost when the draft becomes a plan (pydantic drops unknown keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config.draft import PINNED_BY_YOU, Draft
from config.hardware import list_profiles, load_profile
from config.model import read_model
from config.planner import PlanError, make_plan
from config.settings import WorkloadSettings

MODELS = sorted((Path(__file__).resolve().parents[1] / "data").glob("*.json"))


@pytest.mark.parametrize("users", [8, 256])
@pytest.mark.parametrize("profile", list_profiles())
def test_rules_use_only_plan_fields(profile: str, users: int) -> None:
    """Every rule on every shipped profile and published model reads and writes only Plan's fields
    (the draft raises KeyError on any other name); a model with no plan there says why instead."""
    planned = 0
    for config in MODELS:
        try:
            plan = make_plan(load_profile(profile), read_model(config), WorkloadSettings(users=users))
        except PlanError:
            continue
        planned += 1
        assert set(plan.reasons) <= set(type(plan).model_fields)
    assert planned, f"no model has a plan on {profile}"


@pytest.mark.parametrize(
    "use",
    [
        lambda d: d.set("max_num_seq", 8, "typo"),
        lambda d: d.values["tensor_parallel"],
        lambda d: d.values.get("executor_backend"),
        lambda d: "kv_cache_gib" in d.pins,
        lambda d: d.pins.get("max_len", 0),
        lambda d: d.reasons.__setitem__("node", "typo"),
        lambda d: d.values.pop("gpu", None),
    ],
)
def test_draft_refuses_names_not_in_plan(use: Any) -> None:
    with pytest.raises(KeyError, match="is not a field of Plan"):
        use(Draft())


def test_draft_pin_wins() -> None:
    draft = Draft(pins={"max_num_seqs": 4})
    assert draft.set("max_num_seqs", 64, "derived") == 4
    assert draft.values["max_num_seqs"] == 4 and draft.reasons["max_num_seqs"] == PINNED_BY_YOU
    with pytest.raises(KeyError):
        Draft(pins={"max_num_seq": 4})
