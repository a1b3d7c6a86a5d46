"""The engine's state, shared through one JSON file that ``serve`` writes and others read.

``python -m backend status`` and the chat page read it; a state that claims to be alive
while its process is gone is reported as failed, so a crashed engine never looks ready.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

State = Literal["starting", "loading", "warming", "ready", "failed", "stopped"]
STATUS_FILE = "status.json"
WARMUP_FILE = "warmup.json"


class EngineStatus(BaseModel):
    state: State = "starting"
    detail: str = ""
    progress: float = Field(default=0.0, ge=0, le=1)
    started_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    pid: int | None = None
    """The ``serve`` process that owns the engine."""
    engine_pid: int | None = None
    """The vLLM server process; its process group holds every engine worker."""
    base_url: str = ""
    model: str = ""
    served_name: str = ""
    demo: bool = False
    plan_summary: str = ""
    plan_reasons: dict[str, str] = Field(default_factory=dict)
    hardware: str = ""
    warmup: dict[str, Any] | None = None
    startup: dict[str, float] | None = None
    """Seconds: launch to /health, warm-up, total; plus vLLM's own splits from its log."""
    notes: list[str] = Field(default_factory=list)
    error: str | None = None
    log_path: str = ""

    @property
    def elapsed_s(self) -> float:
        return self.updated_at - self.started_at


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_status(run_dir: Path, status: EngineStatus) -> None:
    """Atomic replace, so a reader never sees half a file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    status.updated_at = time.time()
    tmp = run_dir / f".{STATUS_FILE}.{os.getpid()}"
    tmp.write_text(status.model_dump_json(indent=2))
    tmp.replace(run_dir / STATUS_FILE)


def read_status(run_dir: Path) -> EngineStatus | None:
    """The current status, or None when no engine was ever started from this run dir."""
    path = run_dir / STATUS_FILE
    try:
        status = EngineStatus.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return EngineStatus(state="failed", detail=f"unreadable status file {path}")
    if status.state in ("starting", "loading", "warming", "ready") and not _alive(status.pid):
        status.state = "failed"
        status.error = status.error or "the serve process is gone (killed or crashed)"
        status.detail = status.error
    return status


def read_warmup(run_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((run_dir / WARMUP_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data
