"""Errors of running, measuring and chatting, in the family of ``config.errors.ErniechatError``.

Importing from here gives the whole hierarchy (config's errors are re-exported), as httpx's
``_exceptions`` does: the command line catches :class:`ErniechatError` once.
"""

from __future__ import annotations

from config.errors import (
    ErniechatError,
    HardwareError,
    ModelReadError,
    PlanError,
    SettingsError,
    TunedProfileError,
)

__all__ = [
    "ChatError",
    "EngineDown",
    "EngineNotReady",
    "EngineRefused",
    "EngineStartError",
    "EngineTimeout",
    "ErniechatError",
    "HardwareError",
    "MeasureError",
    "ModelReadError",
    "NodeError",
    "PageError",
    "PlanError",
    "RunBusy",
    "SettingsError",
    "TooLong",
    "TunedProfileError",
    "UsageError",
    "WarmupError",
]


class UsageError(ErniechatError, ValueError):
    """A command's argument is out of range or malformed; the message names the flag."""


class EngineStartError(ErniechatError, RuntimeError):
    """The engine could not start; the message says why and what to do."""

    exit_code = 1


class RunBusy(EngineStartError):
    """Another start holds the run directory or a port: refused before anything starts."""


class NodeError(EngineStartError):
    """A node of a multi-node plan could not take part: it never joined, was refused (another
    vLLM or other model files), failed or went silent. The message names the node and the fix."""


class WarmupError(ErniechatError, RuntimeError):
    """A warm-up request failed: the engine is not fit to take users."""

    exit_code = 1


class EngineNotReady(ErniechatError, RuntimeError):
    """A command needs a running, ready engine and the run directory has none."""


class MeasureError(ErniechatError, RuntimeError):
    """A measurement could not be taken (bench, tune, bench-startup, verify): a request failed, the
    engine stopped or a client process died. The message says which."""

    exit_code = 1


class PageError(ErniechatError, RuntimeError):
    """The chat page's socket refused, dropped or never answered a measuring client."""

    exit_code = 1


# -- the chat page: each one is a sentence the person at the page can act on ----------------
class ChatError(ErniechatError):
    """Shown in the chat as it is; ``retry`` says whether resending the message can help."""

    retry = True
    exit_code = 1


class EngineDown(ChatError):
    """The engine cannot be reached, or its status file says it has stopped or failed."""


class EngineTimeout(ChatError):
    """No first token, or a gap between tokens, within the allowed time."""


class EngineRefused(ChatError):
    """The engine answered with an HTTP error: a 4xx is the request's own fault, so resending it
    the same cannot help; a 5xx may pass once the engine recovers."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.retry = status is None or status >= 500


class TooLong(ChatError):
    """The new message does not fit in the context window on its own; nothing was sent."""

    retry = False

    def __init__(
        self, tokens: int, limit: int, window: int, reply_budget: int, kept_turns: int, system_tokens: int = 0
    ) -> None:
        self.tokens, self.limit = tokens, limit
        room = (
            f"at most **{limit:,}** fit — the model's context is {window:,} tokens and "
            f"{reply_budget:,} are kept for the reply (Max tokens in the settings)"
        )
        kept = f"Your earlier conversation ({kept_turns} turn{'s' if kept_turns != 1 else ''}) is kept."
        if reply_budget >= window:
            text = (
                f"**Max tokens** in the chat settings ({reply_budget:,}) leaves no room for your message in the "
                f"model's {window:,}-token context. Your message was **not sent**; lower Max tokens. {kept}"
            )
        elif system_tokens > limit:
            text = (
                f"The **system prompt** in the chat settings is too long: it needs **{system_tokens:,} tokens** "
                f"on its own, but {room}. Your message was **not sent**; shorten the system prompt. {kept}"
            )
        else:
            text = (
                f"Your message is too long: it needs **{tokens:,} tokens** (with the system prompt), but {room}. "
                f"It was **not sent**; shorten it or lower Max tokens. {kept}"
            )
        super().__init__(text)
