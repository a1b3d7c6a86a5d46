"""What the tests wait on for minutes, launched as soon as the tests are collected.

Starting a vLLM engine takes a minute or more on two cores, much of it one core importing and
compiling, and the demo image's build minutes more, much of it network and one-core commits. A
fixture that holds such a thing registers its launcher here under its own name (at import, that
is during collection); once the tests are collected, every registered thing a selected test uses
is launched at once (``conftest.pytest_collection_finish``), its files in pytest's own temporary
directories, and the fixture takes it, launched, and waits for it to be ready. What no test took is
stopped at the end of the session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import pytest


class Launched(Protocol):
    def stop(self) -> object: ...


T = TypeVar("T", bound=Launched)

Launcher = Callable[[pytest.TempPathFactory], T]
"""Starts the thing (its files under the factory's directories) and returns it, not waiting for it."""

_LAUNCHERS: dict[str, Launcher[Launched]] = {}
_LAUNCHED = pytest.StashKey[dict[str, Launched]]()


def launched_early(fixture: str) -> Callable[[Launcher[T]], Launcher[T]]:
    """Register ``launcher`` for ``fixture``."""

    def register(launcher: Launcher[T]) -> Launcher[T]:
        _LAUNCHERS[fixture] = launcher
        return launcher

    return register


def uses(item: pytest.Item, fixture: str) -> bool:
    return fixture in getattr(item, "fixturenames", ())


def launch_early(session: pytest.Session) -> None:
    """Launch what a collected test will use, every registered thing at once (nothing when only
    collecting: ``--collect-only`` runs no test)."""
    launched = session.config.stash.setdefault(_LAUNCHED, {})
    if session.config.option.collectonly:
        return
    factory: pytest.TempPathFactory = session.config._tmp_path_factory  # type: ignore[attr-defined]  # as pytest's own
    for fixture, launcher in _LAUNCHERS.items():
        if any(uses(item, fixture) for item in session.items):
            launched[fixture] = launcher(factory)


def take(request: pytest.FixtureRequest, launcher: Launcher[T]) -> T:
    """The thing launched early for this fixture (``launcher`` now if it was not)."""
    found = request.config.stash.get(_LAUNCHED, {}).pop(str(request.fixturename), None)
    if found is not None:
        return found  # type: ignore[return-value]  # registered for this fixture by its own launcher
    return launcher(request.getfixturevalue("tmp_path_factory"))


def stop_untaken(config: pytest.Config) -> None:
    """Stop what was launched for tests that did not run (a session cut short or failing early)."""
    for thing in config.stash.get(_LAUNCHED, {}).values():
        thing.stop()
