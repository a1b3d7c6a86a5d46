"""The project's one error family: every error raised on purpose derives from :class:`ErniechatError`.

Library code raises and never exits; the command line catches the base class once and prints
the message, which always names what was wrong and what to do instead. Config's own errors
live here; ``backend.errors`` adds those of running, measuring and chatting.
"""

from __future__ import annotations


class ErniechatError(Exception):
    """Base of every error the project raises on purpose; the message is for a person."""

    exit_code = 2
    """The command line's exit status: 2 for bad input, 1 for a run that failed."""


class SettingsError(ErniechatError, ValueError):
    """A bad key or value in the file, the environment or a flag; one line, names the key."""


class HardwareError(ErniechatError, ValueError):
    """A profile that cannot be read, or detection that failed; the message names the fix."""


class ModelReadError(ErniechatError, ValueError):
    """A model whose config cannot be found or read; the message names the source."""


class PlanError(ErniechatError, ValueError):
    """No valid plan: the message names the rule and what would work instead."""


class TunedProfileError(ErniechatError, ValueError):
    """A tuned profile file that cannot be read; the message names the file."""
