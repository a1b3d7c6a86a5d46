"""Two setups on one page (``up --compare``): each message answered by both, one after the other.

The plan's status names the compared setup (``EngineStatus.compared``), whose own run directory says
where it listens, so the page holds one :class:`~backend.page.link.EngineLink` per setup. With the
chat setting "Compare" on (its default where a setup is compared), a message is answered by the plan
and by the compared setup in turn, never at once, so neither slows the other; which goes first
alternates message by message. Each setup keeps its own history (its own replies, rebuilt from the
stored chat on reopen: ``chats.resume``), and each reply is headed with its setup's name, which its
latency row carries too (``latency.timing_row``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chainlit as cl
from chainlit.input_widget import InputWidget, Switch

from backend.page.chats.resume import COMPARED_KEY
from backend.page.link import EngineLink
from backend.runtime.status import EngineStatus
from config.compare import PLAN_LABEL

SWITCH = "compare"
"""The chat setting that turns comparing on and off."""
HISTORY = "history"
"""The session key of the plan's history (the only one without a compared setup)."""
COMPARED_HISTORY = "compared_history"
TURNS = "compared_turns"
"""The session key counting this chat's messages both setups answered: whose turn is first."""
SETUP_KEY = "setup"
"""A reply's metadata key: the name of the setup that wrote it."""


@dataclass(frozen=True)
class Setup:
    """One setup that answers: its name, its link to its engine, and where its history is kept."""

    label: str
    link: EngineLink
    compared: bool = False
    heading: str = ""
    """What its replies start with: its name in bold where two setups answer, else nothing."""

    @property
    def history_key(self) -> str:
        return COMPARED_HISTORY if self.compared else HISTORY

    @property
    def metadata(self) -> dict[str, Any]:
        """What its replies keep in their metadata: its name, and whether it is the compared one."""
        return {SETUP_KEY: self.label, **({COMPARED_KEY: True} if self.compared else {})}


@dataclass
class Setups:
    """The page's setups: the plan's link, and the compared setup's once the plan's status names one."""

    link: EngineLink
    _links: dict[str, EngineLink] = field(default_factory=dict)

    def compared(self, status: EngineStatus | None = None) -> Setup | None:
        """The compared setup the plan's status names (its link made once per run directory), else None."""
        status = status if status is not None else self.link.status()
        named = status.compared if status is not None else None
        if named is None:
            return None
        if named.run_dir not in self._links:
            s = self.link.settings
            engine = s.engine.model_copy(update={"run_dir": Path(named.run_dir)})
            self._links[named.run_dir] = EngineLink(s.model_copy(update={"engine": engine}))
        return Setup(named.label, self._links[named.run_dir], compared=True, heading=f"**{named.label}**\n\n")

    def plan(self, status: EngineStatus | None = None) -> Setup:
        """The plan: headed with its name where a setup is compared beside it."""
        beside = self.compared(status) is not None
        return Setup(PLAN_LABEL, self.link, heading=f"**{PLAN_LABEL}**\n\n" if beside else "")

    def for_message(self) -> list[Setup]:
        """Who answers this chat's next message, in order: the plan alone, or (Compare on) both, the
        first of them alternating message by message."""
        status = self.link.status()
        second = self.compared(status)
        plan = self.plan(status)
        settings = cl.user_session.get("chat_settings") or {}
        if second is None or settings.get(SWITCH, True) is not True:
            return [plan]
        turn = cl.user_session.get(TURNS) or 0
        cl.user_session.set(TURNS, turn + 1)
        return [plan, second] if turn % 2 == 0 else [second, plan]

    async def prepare(self, status: EngineStatus | None) -> None:
        """Learn the compared engine's window and template before the first message, as the plan's is."""
        second = self.compared(status)
        if second is not None:
            second_status = second.link.status()
            if second_status is None or second_status.state == "ready":
                await second.link.prepare(second.link.locate(second_status))


def switches(status: EngineStatus | None) -> list[InputWidget]:
    """The chat setting "Compare", where the plan's status names a compared setup (on by default)."""
    if status is None or status.compared is None:
        return []
    label = f"Compare: each message answered by the plan, then by {status.compared.label} (in turn)"
    return [Switch(id=SWITCH, label=label, initial=True)]


def begin(compared_history: list[dict[str, str]] | None) -> None:
    """A chat's compared history (a reopened chat's, rebuilt) and whose turn comes first next."""
    cl.user_session.set(COMPARED_HISTORY, compared_history or [])
    cl.user_session.set(TURNS, len(compared_history or []) // 2)
