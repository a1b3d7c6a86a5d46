"""What a run starts, in the order it started them, stopped in reverse.

Every kind of thing a run starts (an engine, the router, the MPS daemon, the chat page's
processes, the head's join point) is a :class:`Component`: it starts and stops. ``serve`` and
``up`` hand each one to a :class:`Supervisor` as it starts, so one call stops them all, the router
before the engines behind it and the MPS daemon after its clients, however far the start got.
Restarting what dies once the run is ready is ``revive.bring_back``'s, driven by the ``keeper``
(engines, router) and by ``up`` (page processes).
"""

from __future__ import annotations

import threading
from typing import Protocol


class Component(Protocol):
    """One thing a run starts and stops."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Supervisor:
    """The components a run has started, in start order."""

    def __init__(self) -> None:
        self.started: list[Component] = []
        self._lock = threading.Lock()

    def start(self, component: Component) -> None:
        """Start ``component``; it is stopped by :meth:`stop` from now on, even if its start fails."""
        with self._lock:
            if component not in self.started:
                self.started.append(component)
        component.start()

    def add(self, component: Component) -> None:
        """One started elsewhere (the router, which starts through its own wait)."""
        with self._lock:
            if component not in self.started:
                self.started.append(component)

    def stop(self, only: type | tuple[type, ...] | None = None) -> None:
        """Stop what was started, the last first; ``only``: just the components of these types."""
        with self._lock:
            chosen = [c for c in self.started if only is None or isinstance(c, only)]
            self.started = [c for c in self.started if c not in chosen]
        for component in reversed(chosen):
            component.stop()
