"""``bench-startup``'s records: what ``startup.json`` holds, one typed object per start."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from backend.runtime.status import StartupRecord, WarmupRecord


class PathWarmth(BaseModel):
    """One request path's first request against its steady state (seconds to first token)."""

    first_ttft_s: float
    steady_ttft_s: float
    """Median of the next few requests, sent back to back."""
    first_over_steady: float
    paused_ttft_s: float | None = None
    """Median of a few requests each sent after a short pause; None when none were paused."""
    first_over_paused: float | None = None


class IdleRound(BaseModel):
    """Every path's first request after the engine sat idle ``idle_s`` (``slept_s`` in fact)."""

    idle_s: float
    slept_s: float
    load1: float
    """The machine's load then (others share it)."""
    at: float
    paths: dict[str, PathWarmth]


class StartupRun(BaseModel):
    """One start of the engine, warm-up on or off, and what its first users met."""

    warmup: bool
    ok: Literal[True] = True
    ready_s: float
    """Launch to ready."""
    startup: StartupRecord | None
    """The start-up phases, as the status file records them."""
    plan: str
    first_user_ttft_s: float
    steady_ttft_s: float
    user_ttfts_s: list[float]
    warmup_record: WarmupRecord | None
    paths: dict[str, PathWarmth]
    after_idle_s: list[IdleRound] = Field(default_factory=list)
    page_chat_ttfts_s: list[list[float | None]] = Field(default_factory=list)
    """Per page start: each new chat's time to first text (None: a reply with no visible text)."""
    page_chat_footers_ms: list[list[tuple[int, int] | None]] = Field(default_factory=list)
    """Per page start: each new chat's footer (the page's TTFT, the engine's share), ms."""


class StartupFailure(BaseModel):
    """A start that never became ready."""

    warmup: bool
    ok: Literal[False] = False
    error: str | None


class StartupReport(BaseModel):
    """``startup.json``."""

    machine: str
    model: str
    runs: list[StartupRun | StartupFailure]
