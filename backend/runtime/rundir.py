"""The engine's run directory as one object: the files ``serve`` writes and everyone else reads.

``status.json`` (where things stand), ``plan.json`` (the plan it was started with),
``warmup.json`` (what warm-up measured), ``engine.log`` and the page's rendered
``page/chainlit.md``. Readers get typed records, never dicts read by string keys.
"""

from __future__ import annotations

import json
from pathlib import Path

from backend.errors import EngineNotReady, PlanError
from backend.runtime.status import EngineStatus, WarmupRecord, read_status, write_status
from config.plan import Plan


class RunDir:
    """One engine's run directory (``engine.run_dir``)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def plan_path(self) -> Path:
        return self.path / "plan.json"

    @property
    def warmup_path(self) -> Path:
        return self.path / "warmup.json"

    @property
    def log_path(self) -> Path:
        return self.path / "engine.log"

    @property
    def page_dir(self) -> Path:
        return self.path / "page"

    # -- status ------------------------------------------------------------------------------
    def status(self) -> EngineStatus | None:
        return read_status(self.path)

    def write_status(self, status: EngineStatus) -> None:
        write_status(self.path, status)

    # -- plan --------------------------------------------------------------------------------
    def write_plan(self, plan: Plan) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.plan_path.write_text(json.dumps(plan.as_json(), indent=2))

    def plan(self) -> Plan | None:
        """The plan the engine was started with; None when there is none or it cannot be read."""
        try:
            return Plan.model_validate_json(self.plan_path.read_text())
        except (OSError, ValueError):
            return None

    def require_plan(self) -> Plan:
        """The plan, or EngineNotReady naming the file and what is wrong with it."""
        try:
            return Plan.from_json(self.plan_path.read_text(), where=str(self.plan_path))
        except OSError as err:
            raise EngineNotReady(f"cannot read the running plan {self.plan_path}: {err.strerror}") from None
        except PlanError as err:
            raise EngineNotReady(f"cannot use the running plan: {err}") from None

    # -- warm-up -----------------------------------------------------------------------------
    def write_warmup(self, record: WarmupRecord) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.warmup_path.write_text(record.model_dump_json(indent=2))

    def warmup(self) -> WarmupRecord | None:
        try:
            return WarmupRecord.model_validate_json(self.warmup_path.read_text())
        except (OSError, ValueError):
            return None
