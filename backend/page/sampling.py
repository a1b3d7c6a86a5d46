"""The session's chat settings (the page's sliders), with ``settings.app`` as the defaults.

The sliders keep a browser within their range; a script can send anything. :func:`checked` brings
what arrives into the sliders' range and says, in a sentence per setting, what it changed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backend.page.history import valid_text
from backend.page.render import as_plain
from config.sampling import Sampling
from config.settings import Settings


@dataclass(frozen=True)
class Knob:
    """One numeric chat setting: its slider and the range it allows."""

    key: str
    label: str
    low: float
    high: float
    step: float
    whole: bool = False

    def fit(self, value: Any, before: float) -> tuple[float, str | None]:
        """``value`` within the range, with the sentence that says what was changed (None: nothing);
        ``before`` stays when ``value`` is not a number."""
        allowed = f"allowed: {_number_text(self.low)} to {_number_text(self.high)}"
        number = _as_number(value)
        if number is None:
            kept = _number_text(before)
            return before, f"{self.label} {_sent(value)} is not a number ({allowed}); it stays at {kept}."
        fitted = min(self.high, max(self.low, number))
        if self.whole:
            fitted = math.floor(fitted)
        if fitted == number:
            return fitted, None
        why = "is not a whole number" if self.low <= number <= self.high else "is out of range"
        return fitted, f"{self.label} {_sent(value)} {why} ({allowed}); {_number_text(fitted)} is used."


def knobs(settings: Settings) -> list[Knob]:
    """The sliders of the chat settings; each range holds its ``settings.app`` default."""
    a = settings.app
    return [
        Knob("temperature", "Temperature", min(0.0, a.temperature), max(2.0, a.temperature), 0.05),
        Knob("top_p", "Top-p", min(0.05, a.top_p), max(1.0, a.top_p), 0.05),
        Knob("max_tokens", "Max tokens (reply)", 1, max(4096, a.max_tokens), 1, whole=True),
    ]


def checked(
    values: Mapping[str, Any], previous: Mapping[str, Any], settings: Settings
) -> tuple[dict[str, Any], list[str]]:
    """``values`` (chat settings as sent) with each numeric one in its slider's range, a text system
    prompt, and the sentences that say what was changed. A value that is no number (or no text)
    leaves ``previous``'s (else the default) in place."""
    clean, said = dict(values), []
    for knob in knobs(settings):
        if knob.key in values:
            before = previous.get(knob.key, getattr(settings.app, knob.key))
            clean[knob.key], why = knob.fit(values[knob.key], before)
            said += [why] if why else []
    if "system_prompt" in values and not isinstance(values["system_prompt"], str):
        clean["system_prompt"] = previous.get("system_prompt", settings.app.system_prompt)
        said.append(f"System prompt {_sent(values['system_prompt'])} is not text; it stays as it was.")
    return clean, said


def sampling_from(values: Mapping[str, Any], settings: Settings) -> Sampling:
    """The session's chat settings, falling back to ``settings.app``; each value within its slider's
    range (:func:`checked` has said what it changed when they arrived)."""
    a = settings.app
    fit = {k.key: k.fit(values.get(k.key, getattr(a, k.key)), getattr(a, k.key))[0] for k in knobs(settings)}
    return Sampling(
        temperature=fit["temperature"],
        top_p=fit["top_p"],
        max_tokens=int(fit["max_tokens"]),
        system_prompt=valid_text(str(values.get("system_prompt", a.system_prompt) or "")),
    )


def _as_number(value: Any) -> float | None:
    """A finite number, from a number or its text; None for anything else (true/false included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _number_text(number: float) -> str:
    """4,096 / 0.05 / 1e+20: as a person reads it."""
    if number == int(number) and abs(number) < 1e15:
        return f"{int(number):,}"
    return f"{number:g}"


def _sent(value: Any, limit: int = 40) -> str:
    """The value as it was sent, quoted when text, cut at ``limit`` characters, and shown as the characters
    it is (a script's ``[x](javascript:...)`` is no link in the chat)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return _number_text(value)
    text = json.dumps(value, default=str, ensure_ascii=False)
    return as_plain(f"{text[: limit - 3]}..." if len(text) > limit else text)
