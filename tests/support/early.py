"""What the tests wait on for minutes, launched as soon as the tests are collected.

Starting a vLLM engine takes a minute or more on two cores, much of it one core importing and
compiling, and the demo image's build minutes more, much of it network and one-core commits. A
fixture that holds such a thing registers its launcher here under its own name (at import, that
is during collection); once the tests are collected, every registered thing a selected test uses
is launched at once (``conftest.pytest_collection_finish``), and the fixture takes it, launched,
and waits for it to be ready. What no test took is stopped at the end of the session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import pytest


class Launched(Protocol):
    def stop(self) -> object: ...


T = TypeVar("T", bound=Launched)

_LAUNCHERS: dict[str, Callable[[], Launched]] = {}
_LAUNCHED = pytest.StashKey[dict[str, Launched]]()


def launched_early(fixture: str) -> Callable[[Callable[[], T]], Callable[[], T]]:
    """Register ``launcher`` (no arguments; returns the thing, started, not waited for) for ``fixture``."""

    def register(launcher: Callable[[], T]) -> Callable[[], T]:
        _LAUNCHERS[fixture] = launcher
        return launcher

    return register


def uses(item: pytest.Item, fixture: str) -> bool:
    return fixture in getattr(item, "fixturenames", ())


def launch_early(session: pytest.Session) -> None:
    """Launch what a collected test will use, every registered thing at once."""
    launched = session.config.stash.setdefault(_LAUNCHED, {})
    for fixture, launcher in _LAUNCHERS.items():
        if any(uses(item, fixture) for item in session.items):
            launched[fixture] = launcher()


def take(request: pytest.FixtureRequest, launcher: Callable[[], T]) -> T:
    """The thing launched early for this fixture (``launcher`` now if it was not)."""
    found = request.config.stash.get(_LAUNCHED, {}).pop(str(request.fixturename), None)
    return found if found is not None else launcher()  # type: ignore[return-value]


def stop_untaken(config: pytest.Config) -> None:
    """Stop what was launched for tests that did not run (a session cut short or failing early)."""
    for thing in config.stash.get(_LAUNCHED, {}).values():
        thing.stop()
