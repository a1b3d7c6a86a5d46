"""The session's chat settings (the page's sliders), with ``settings.app`` as the defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.page.history import valid_text
from config.settings import Settings


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int
    system_prompt: str

    @classmethod
    def from_values(cls, values: dict[str, Any], settings: Settings) -> Sampling:
        """The session's chat settings, falling back to ``settings.app``; a value the page's sliders
        would not give (from a script) is brought into their range, or the default when not a number."""
        a = settings.app
        return cls(
            temperature=_within(values.get("temperature"), a.temperature, 0.0, 2.0),
            top_p=_within(values.get("top_p"), a.top_p, 0.05, 1.0),
            max_tokens=int(_within(values.get("max_tokens"), a.max_tokens, 1, None)),
            system_prompt=valid_text(str(values.get("system_prompt", a.system_prompt) or "")),
        )

    @classmethod
    def defaults(cls, settings: Settings) -> Sampling:
        return cls.from_values({}, settings)


def _within(value: Any, default: float, low: float, high: float | None) -> float:
    """``value`` as a number in [low, high] (vLLM's own bounds for temperature, the slider's for
    top-p); ``default`` when it is missing or not a number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    if number != number:  # NaN
        return default
    return max(low, number if high is None else min(high, number))
