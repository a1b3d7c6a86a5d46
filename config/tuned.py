"""Tuned profiles: the pins ``tune`` measured best, applied by the next ``serve`` on the same machine.

A profile lives in ``<engine.run_dir>/tuned/<key>.json``; the key is a slug of (hardware name,
model id, objective), and the file repeats all three so a slug collision is never mistaken for
a match. ``plan_for`` applies a matching profile's pins *under* the user's own pins (the user's
``--set`` always wins) and says so in a note and in each tuned value's reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from config.draft import PINNED_BY_YOU
from config.errors import PlanError, TunedProfileError
from config.plan import PINNABLE, Plan

TUNED_DIR = "tuned"
MAX_KEY_LEN = 120


class TunedProfile(BaseModel):
    """What ``tune`` found best for one (hardware, model, objective), and the numbers behind it."""

    hardware: str
    """``Hardware.name`` as the planner saw it (e.g. 'this machine: 1x NVIDIA H200')."""
    model: str
    """``model.id`` as the user gave it (``demo``, a Hugging Face id or a directory)."""
    objective: str
    """The workload objective (latency | throughput | balanced) the tune ran under."""
    pins: dict[str, Any] = Field(default_factory=dict)
    """The winner's plan values that differ from the planner's default; empty: the default won."""
    measured_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    """ISO timestamp (UTC) of the tune run."""
    objective_ms: float | None = None
    """The p99 TTFT bound the winner was chosen under; None: highest tokens/s, no bound."""
    concurrency: int | None = None
    """Concurrent requests the candidates were compared at."""
    winner: str = ""
    measurements: list[dict[str, Any]] = Field(default_factory=list)
    """One entry per candidate: its pins, plan values, start-up time and measured levels."""
    default_vs_best: dict[str, Any] = Field(default_factory=dict)

    @property
    def date(self) -> str:
        return self.measured_at[:10]


def slug(text: str) -> str:
    """Lower-case letters, digits and single dashes: safe in any file name."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def profile_key(hardware: str, model: str, objective: str) -> str:
    """``<hardware>--<model>--<objective>``; a long key is cut and given a hash of the whole."""
    key = "--".join(slug(part) for part in (hardware, model, objective))
    if len(key) > MAX_KEY_LEN:
        digest = hashlib.sha256("\0".join((hardware, model, objective)).encode()).hexdigest()[:10]
        key = f"{key[: MAX_KEY_LEN - 11]}-{digest}"
    return key


def tuned_path(run_dir: Path, hardware: str, model: str, objective: str) -> Path:
    return Path(run_dir) / TUNED_DIR / f"{profile_key(hardware, model, objective)}.json"


def save_tuned(run_dir: Path, profile: TunedProfile) -> Path:
    """Write the profile (atomically: a concurrent ``serve`` never reads half a file)."""
    path = tuned_path(run_dir, profile.hardware, profile.model, profile.objective)
    bad = sorted(set(profile.pins) - set(PINNABLE))
    if bad:
        raise TunedProfileError(f"tuned profile pins {', '.join(bad)} are not pinnable; allowed: {', '.join(PINNABLE)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(profile.model_dump(mode="json"), indent=2))
    tmp.replace(path)
    return path


def load_tuned(run_dir: Path, hardware: str, model: str, objective: str) -> tuple[TunedProfile, Path] | None:
    """The profile for exactly this (hardware, model, objective), or None. Raises TunedProfileError."""
    path = tuned_path(run_dir, hardware, model, objective)
    try:
        profile = TunedProfile.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError, ValueError) as err:
        why = type(err).__name__
        raise TunedProfileError(f"tuned profile {path} is unreadable ({why}); delete it or re-run tune") from None
    if (profile.hardware, profile.model, profile.objective) != (hardware, model, objective):
        return None
    return profile, path


def plan_with_tuned(
    make: Callable[[dict[str, Any]], Plan],
    run_dir: Path,
    hardware: str,
    model: str,
    objective: str,
    user_pins: dict[str, Any],
    notes: list[str],
) -> Plan:
    """``make(pins)`` with a matching tuned profile's pins under ``user_pins``; notes say what was used.

    A profile whose pins no longer make a valid plan (other hardware state, a newer planner)
    is left out with a note rather than stopping the start.
    """
    try:
        found = load_tuned(run_dir, hardware, model, objective)
    except TunedProfileError as err:
        notes.append(str(err))
        found = None
    if found is None:
        return make(user_pins)
    profile, path = found
    pins = {**profile.pins, **user_pins}
    try:
        plan = make(pins)
    except PlanError as err:
        notes.append(f"tuned profile {path} (measured {profile.date}) not used: {err}")
        return make(user_pins)
    notes.append(f"using tuned profile {path} (measured {profile.date})")
    for key in set(profile.pins) - set(user_pins):
        reason = plan.reasons.get(key, "")
        plan.reasons[key] = reason.replace(PINNED_BY_YOU, f"tuned profile ({profile.date}, `tune`)", 1)
    return plan
