"""How a reply is drawn: the one record the chat page, warm-up and the benchmarks pass around.

``app`` settings give the page's defaults (``AppSettings.sampling``); the page fits what a
browser sends into its sliders' range (``backend/page/sampling.py``); warm-up sends the page's
defaults, so that the path a user's first message takes is compiled before anyone is let in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """One chat's settings: how tokens are drawn, how long a reply may be, the system prompt."""

    temperature: float
    top_p: float
    max_tokens: int
    system_prompt: str

    @property
    def draws(self) -> bool:
        """Whether tokens are drawn at random (a temperature above 0), not chosen greedily: the performance model
        charges a drawn token its sampler's cost (``HostCosts.sample_us``)."""
        return self.temperature > 0

    def draw_fields(self) -> dict[str, float]:
        """What a request body says about drawing tokens (``max_tokens`` and the system prompt go
        elsewhere in it: a measuring request fixes its own reply length)."""
        return {"temperature": self.temperature, "top_p": self.top_p}
