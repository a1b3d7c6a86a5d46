"""``up --compare``: a second setup beside the plan, on the same machine, started by the same ``up``.

Both setups are planned before anything starts (``config.compare``), each for its half of the machine;
a pair that cannot run at once, or a port the compared setup needs that is taken, is refused then,
with nothing started. The compared setup is a second ``Server`` with a run directory of its own inside
the plan's (``compare/``: its status, plan, logs and warm-up) and the port after the plan's last; it
starts once the plan is ready and warmed (engines that measure free GPU memory at start must not start
together), is watched and restarted as the plan is, and stops before it. The plan's status names it
(``EngineStatus.compared``), so ``status`` and the chat page find both.
"""

from __future__ import annotations

from collections.abc import Callable

from backend.errors import PlanError
from backend.runtime.components.placement import check_ports
from backend.runtime.processes.process import IN_USE, bind_problem
from backend.runtime.resolve import resolve_model
from backend.runtime.serve import Server
from backend.runtime.status import ComparedRecord
from config.compare import PLAN_LABEL, CompareSpec, plan_pair
from config.settings import Settings


class Beside:
    """The compared setup's Server, planned with the plan's (which ``planned`` hands the plan's Server)."""

    def __init__(self, server: Server, label: str) -> None:
        self.server = server
        self.label = label
        self.up = False
        """Started and not given up on (``check``)."""

    @classmethod
    def planned(cls, plan_server: Server, spec: CompareSpec, say: Callable[[str], None] = print) -> Beside:
        """Plan both setups, hand the plan's to ``plan_server`` and claim the compared one's run directory
        and ports; PlanError (nothing started) where they cannot run at once or a port is taken."""
        settings = plan_server.settings
        resolved = resolve_model(settings)
        pair = plan_pair(settings, spec, resolved.path)
        other: Settings = pair.second_settings
        e = other.engine
        problem = bind_problem(e.host, e.port)
        if problem:
            taken = "is already in use (another engine?)" if problem == IN_USE else problem
            raise PlanError(
                f"port {e.port} on {e.host}, where the compared setup ({pair.label}) would listen after the plan's "
                f"ports, {taken}; stop what holds it or choose another --engine-port"
            )
        check_ports(pair.second.plan, e.host, e.port, plan_server.page_port, 0)
        plan_server.given = pair.first
        plan_server.status.setup = PLAN_LABEL
        plan_server.status.compared = ComparedRecord(label=pair.label, run_dir=str(e.run_dir))
        plan_server.status.notes.extend(pair.notes)
        second = Server(other, say=lambda line: say(f"[{pair.label}] {line}"), given=pair.second)
        second.page_port = plan_server.page_port
        second.status.setup = pair.label
        second.claim()
        for note in pair.notes:
            say(f"note: {note}")
        return cls(second, pair.label)

    def start(self) -> bool:
        """Start and warm the compared setup (the plan is ready); False, with its error said, when it fails."""
        print(f"starting the compared setup ({self.label}) beside the plan", flush=True)
        self.up = self.server.start()
        if self.up:
            print(f"ready ({self.label}): {self.server.base_url}", flush=True)
        return self.up

    def check(self) -> None:
        """Restart what died; once it is given up on, its status says why and the page shows it."""
        if self.up and not self.server.check():
            self.up = False

    def stop(self) -> None:
        self.server.stop()
