"""The engine's state, shared through one JSON file that ``serve`` writes and others read.

``python -m backend status`` and the chat page read it; a state that claims to be alive
while its process is gone is reported as failed, so a crashed engine never looks ready.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_serializer

from backend.runtime.processes.groups import alive, running
from backend.runtime.processes.leftovers import find_leftovers
from config.performance.calibrate import WarmupSample
from config.performance.forecast import Forecast

State = Literal["starting", "loading", "warming", "ready", "failed", "stopped"]
LIVE_STATES = ("starting", "loading", "warming", "ready")
"""States that claim ``serve`` is running: reported as failed once its process is gone."""
STATUS_FILE = "status.json"
WARMUP_FILE = "warmup.json"


class KindWarmth(BaseModel):
    """One request path's first-token time: its very first request, and once warm."""

    first_ttft_s: float
    steady_ttft_s: float


class WarmupRecord(BaseModel):
    """What the warm-up measured: first against steady first-token latency, per shape and path.
    Saved as ``warmup.json`` and inside the status; sets the page's first-token timeout."""

    disabled: bool = False
    first_ttft_s: float = 0.0
    steady_ttft_s: float = 0.0
    first_over_steady: float | None = None
    max_ttft_s: float = 0.0
    requests: int = 0
    concurrency: int = 0
    concurrent_ttft_p50_s: float = 0.0
    rounds: int = 0
    prompt_tokens: dict[str, int] = Field(default_factory=dict)
    replicas: int = 0
    replicas_warmed: list[str] = Field(default_factory=list)
    by_shape: dict[str, dict[str, float]] = Field(default_factory=dict)
    by_kind: dict[str, KindWarmth] = Field(default_factory=dict)
    """Per request path (``warmup.KINDS``): chat or completions, streamed or whole, sampled or greedy.
    ``first_ttft_s`` / ``steady_ttft_s`` above are the page's path (chat, streamed, sampled)."""
    duration_s: float = 0.0
    samples: list[WarmupSample] = Field(default_factory=list)
    """Every timed request of the shapes the performance model calibrates from (``calibrate``)."""


class StartupRecord(BaseModel):
    """Where a start's seconds went, and the KV cache it got. Saved inside the status and copied
    into ``tune``'s and ``bench-startup``'s records; what vLLM's log did not say is absent, not null."""

    to_health_s: float
    """Launch to every engine's ``/health``."""
    warmup_s: float
    total_s: float
    """``serve``'s start to ready: planning, launch, warm-up, the router."""
    weights_s: float | None = None
    """vLLM's own splits, from its log (``logwatch.STARTUP_SPLITS``)."""
    compile_s: float | None = None
    engine_init_s: float | None = None
    graphs_s: float | None = None
    kv_tokens: int | None = None
    """Tokens per engine vLLM allocated, read from its log."""
    kv_tokens_planned: int | None = None
    """The plan's arithmetic for the same; given only beside ``kv_tokens``."""

    @classmethod
    def measured(
        cls,
        to_health_s: float,
        warmup_s: float,
        total_s: float,
        splits: Mapping[str, float] | None,
        kv_tokens: int | None,
        kv_tokens_planned: int,
    ) -> StartupRecord:
        """The record of a start that just became ready: seconds rounded to 0.1, vLLM's splits by
        their field names, and the plan's KV tokens only where vLLM's can be set beside them."""
        kv = {"kv_tokens": kv_tokens, "kv_tokens_planned": kv_tokens_planned} if kv_tokens is not None else {}
        return cls.model_validate(
            {
                "to_health_s": round(to_health_s, 1),
                "warmup_s": round(warmup_s, 1),
                "total_s": round(total_s, 1),
                **(splits or {}),
                **kv,
            }
        )

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None}


class RouterRecord(BaseModel):
    """The router in front of several engines, as ``status`` shows it (its engines: ``engines``)."""

    url: str
    pid: int | None = None
    alive: bool = False
    policy: str
    session_header: str
    """The header a conversation is kept on one engine by."""
    version: str
    """The pinned ``vllm-router`` release."""
    log: str


class ComparedRecord(BaseModel):
    """The setup compared beside this run's plan (``up --compare``): its name and the run directory
    that holds its own status, plan and logs."""

    label: str
    run_dir: str


EngineState = Literal["serving", "exited", "restarting", "gave up"]


class EngineReport(BaseModel):
    """One engine of a routed plan as ``status`` shows it: ``serve``'s own view (its process, its
    restarts) beside the router's (in rotation, load) and the engine's own ``/health``."""

    name: str
    url: str
    pid: int | None = None
    state: EngineState = "serving"
    detail: str = ""
    """Why it is not serving: its exit code, the restart's phase, why it was given up."""
    restarts: int = 0
    in_rotation: bool | None = None
    """The router's view: True while it sends requests there; None when the router cannot be asked."""
    answers: bool = False
    """Its own ``/health`` answered 200 at the last check."""
    load: int | None = None
    """Requests the router has in flight there (None when not reported)."""


PageState = Literal["up", "restarting", "down"]


class PageProcess(BaseModel):
    """One process of the chat page: the front that hands connections over, or one that serves chats."""

    pid: int
    role: Literal["front", "chats"] = "chats"
    state: PageState = "up"


class PageRecord(BaseModel):
    """The chat page ``up`` runs, as ``status`` shows it: its own state and each of its processes'. A
    process that is gone when the status is read shows ``down`` at once, whatever ``up`` last wrote."""

    url: str
    state: PageState = "up"
    detail: str = ""
    restarts: int = 0
    processes: list[PageProcess] = Field(default_factory=list)

    def as_seen_now(self) -> PageRecord:
        """This record with each process's state checked now: ``down`` once it is gone (a page up
        with a process gone is down until ``up`` says it restarts it)."""
        seen = self.model_copy(deep=True)
        for process in seen.processes:
            if not running(process.pid):
                process.state = "down"
        gone = [p for p in seen.processes if p.state == "down"]
        if seen.state == "up" and gone:
            seen.state = "down"
            seen.detail = f"process {gone[0].pid} is gone" + ("" if len(gone) == 1 else f" (and {len(gone) - 1} more)")
        return seen


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
    warmup: WarmupRecord | None = None
    startup: StartupRecord | None = None
    """Set once ready: launch to /health, warm-up, total; vLLM's own splits and KV cache from its log."""
    router: RouterRecord | None = None
    """The router in front of several engines, when the plan has one."""
    engines: list[EngineReport] = Field(default_factory=list)
    """Behind the router: each engine, as ``serve``, the router and the engine itself see it."""
    page: PageRecord | None = None
    """The chat page, when ``up`` runs it."""
    notes: list[str] = Field(default_factory=list)
    error: str | None = None
    log_path: str = ""
    setup: str = ""
    """This run's name where two setups are compared (``plan``, or the compared one's); empty otherwise."""
    compared: ComparedRecord | None = None
    """The setup compared beside this plan (``up --compare``), whose status is in its own run directory."""
    expected: Forecast | None = None
    """What the plan is expected to deliver (the performance model), with this host's costs once the
    warm-up calibrated them."""


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
    except OSError as err:  # a directory in its place, a run dir that is a file, no permission
        why = f"unreadable status file {path}: {err.strerror or err}"
        return EngineStatus(state="failed", detail=why, error=why)
    except ValidationError as err:  # not JSON, or not a status (another program's file, a newer version's)
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"]))
        why = f"unreadable status file {path}: {where + ': ' if where else ''}{first['msg']}"
        return EngineStatus(state="failed", detail=why, error=why)
    if status.page is not None:
        status.page = status.page.as_seen_now()
    if status.state in LIVE_STATES and not alive(status.pid):
        status.state = "failed"
        engine = status.engine_pid
        still = ""
        if engine and engine in {left.pgid for left in find_leftovers()}:  # its own, not a reused group id
            still = f"; its engine (process group {engine}) still runs: the next start stops it, or kill -- -{engine}"
        status.error = status.error or f"the serve process is gone (killed or crashed){still}"
        status.detail = status.error
    return status


class StatusReader:
    """One run dir's status for a reader that asks often (the chat page, on each message): the file
    is read and parsed again only when ``serve`` has replaced it (:func:`write_status`), and a live
    state is still checked against its ``serve`` process on every read."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._last: tuple[tuple[int, int, int], EngineStatus | None] | None = None

    def read(self) -> EngineStatus | None:
        """What :func:`read_status` says now (the same object while the file is unchanged)."""
        try:
            st = (self.run_dir / STATUS_FILE).stat()
        except OSError:
            self._last = None
            return read_status(self.run_dir)
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._last is not None and self._last[0] == key:
            status = self._last[1]
            if status is None or status.state not in LIVE_STATES or alive(status.pid):
                return status
        status = read_status(self.run_dir)
        self._last = (key, status)
        return status
