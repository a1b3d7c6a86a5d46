"""The session's chat settings (the page's sliders), with ``settings.app`` as the defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from config.settings import Settings


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int
    system_prompt: str

    @classmethod
    def from_values(cls, values: dict[str, Any], settings: Settings) -> Sampling:
        """The session's chat settings, falling back to ``settings.app``."""
        a = settings.app
        return cls(
            temperature=float(values.get("temperature", a.temperature)),
            top_p=float(values.get("top_p", a.top_p)),
            max_tokens=max(1, int(values.get("max_tokens", a.max_tokens))),
            system_prompt=str(values.get("system_prompt", a.system_prompt) or ""),
        )

    @classmethod
    def defaults(cls, settings: Settings) -> Sampling:
        return cls.from_values({}, settings)
