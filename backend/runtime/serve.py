"""``serve``: plan, start vLLM, follow its log, gate readiness on health + warm-up, then watch.

The engine is ready only after /health answers, /v1/models lists the model and the
warm-up has passed. The status file tells every other process where things stand.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from backend.engine_api import engine_url, headers, root_url
from backend.runtime.cluster import RayHead, worker_lines
from backend.runtime.display import DEMO_BANNER, Display
from backend.runtime.logwatch import LogState
from backend.runtime.process import EngineProcess, EngineStartError, port_in_use
from backend.runtime.resolve import ResolvedModel, resolve_model
from backend.runtime.rundir import RunDir
from backend.runtime.status import EngineStatus, WarmupRecord
from backend.runtime.warmup import WarmupError, warm_up
from config.commands import engine_argv, engine_env
from config.pipeline import Planned, plan_for
from config.plan import Plan
from config.settings import Settings

ENGINE_CORE_TITLE = "VLLM::EngineCor"  # vLLM's process title "VLLM::EngineCore…", as Linux keeps 15 chars


class Server:
    """One engine from start to stop; ``up`` drives it and the chat page together."""

    def __init__(self, settings: Settings, say: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.say = say
        self.run_dir = RunDir(settings.engine.run_dir)
        self.status = EngineStatus(pid=os.getpid(), log_path=str(self.run_dir.log_path))
        self.engine: EngineProcess | None = None
        self.ray: RayHead | None = None
        self.planned: Planned | None = None
        self.resolved: ResolvedModel | None = None
        self.t0 = time.monotonic()
        self.display = Display(self.t0)

    # -- status --------------------------------------------------------------------------
    def update(self, state: str | None = None, detail: str | None = None, progress: float | None = None) -> None:
        if state:
            self.status.state = state  # type: ignore[assignment]
        if detail is not None:
            self.status.detail = detail
        if progress is not None:
            self.status.progress = progress
        self.run_dir.write_status(self.status)
        self.display.show(self.status.state, self.status.detail, self.status.progress)

    def fail(self, message: str) -> None:
        self.status.error = message
        self.update("failed", message)
        self.display.done()

    @property
    def base_url(self) -> str:
        return engine_url(self.settings.engine.host, self.settings.engine.port)

    # -- start ---------------------------------------------------------------------------
    def start(self) -> bool:
        """Resolve, plan, launch, wait for health, warm up. True when ready."""
        e = self.settings.engine
        self.update("starting", "resolving the model", 0.01)
        if port_in_use(e.host, e.port):
            self.fail(
                f"port {e.port} on {e.host} is already in use (another engine?); stop it or choose "
                "another with --engine-port"
            )
            return False
        self.resolved = resolve_model(self.settings)
        if self.resolved.demo:
            self.status.demo = True
            why = self.resolved.note or "You asked for --model demo."
            self.display.done()
            self.say(DEMO_BANNER.format(why=why))
            if self.resolved.note:
                self.status.notes.append(self.resolved.note)
        self.update(detail="planning", progress=0.03)
        self.planned = plan_for(self.settings, model_path=self.resolved.path)
        plan = self.planned.plan
        self.status.model = self.settings.model.id if not self.resolved.demo else f"demo ({self.resolved.path})"
        self.status.served_name = plan.served_name
        self.status.plan_summary = plan.summary()
        self.status.plan_reasons = plan.reasons
        self.status.hardware = self.planned.hardware.name
        self.status.base_url = self.base_url
        self.status.notes.extend(self.planned.notes + plan.warnings)
        for note in self.planned.notes:
            self.say(f"note: {note}")

        argv = engine_argv(plan, python=e.python, model_path=self.resolved.path, host=e.host, port=e.port)
        argv += e.extra_args
        env = engine_env(plan, self.planned.hardware.gpus_per_node, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if e.api_key:
            env["VLLM_API_KEY"] = e.api_key
        self.run_dir.write_plan(plan)
        self.engine = EngineProcess(argv, env, self.run_dir.log_path, cwd=self.run_dir.path)
        self.display.done()
        self.say(f"plan: {plan.summary()}; engine log: {self.status.log_path}")
        self.say("engine: " + " ".join(argv))
        launch = time.monotonic()
        try:
            if plan.nodes > 1:
                self._start_cluster(plan)
            self.engine.start()
        except EngineStartError as err:
            self.fail(str(err))
            return False
        self.status.engine_pid = self.engine.pid
        self.update("starting", "launching vLLM", 0.04)
        if not self._wait_healthy():
            return False
        to_health = time.monotonic() - launch
        self._lower_engine_core(plan)
        warm_t0 = time.monotonic()
        if not self._warm_up():
            return False
        self.status.startup = {
            "to_health_s": round(to_health, 1),
            "warmup_s": round(time.monotonic() - warm_t0, 1),
            "total_s": round(time.monotonic() - self.t0, 1),
            **(self._log.splits or {}),
        }
        self.update("ready", f"ready: {plan.summary()}", 1.0)
        self.display.done()
        return True

    def _lower_engine_core(self, plan: Plan) -> None:
        """Apply the plan's engine_core_nice; once healthy, the worker exists and keeps its priority."""
        if not plan.engine_core_nice or self.engine is None:
            return
        pids = self.engine.lower_priority(ENGINE_CORE_TITLE, plan.engine_core_nice)
        if pids:
            self.say(f"engine core (pid {', '.join(map(str, pids))}) at nice {plan.engine_core_nice}")
        else:
            note = (
                f"no '{ENGINE_CORE_TITLE}' process found to lower to nice {plan.engine_core_nice}; "
                "replies may stall on few cores"
            )
            self.status.notes.append(note)
            self.say(f"note: {note}")

    def _wait_healthy(self) -> bool:
        assert self.engine is not None and self.planned is not None
        self._log = LogState()
        deadline = time.monotonic() + self.settings.engine.start_timeout_s
        log_path = Path(self.status.log_path)
        offset = 0
        served = self.planned.plan.served_name
        with httpx.Client(timeout=httpx.Timeout(2.0)) as http:
            while time.monotonic() < deadline:
                offset = self._read_log(log_path, offset)
                if self._log.fatal:
                    self.engine.stop()
                    self.fail(f"{self._log.fatal.what}: {self._log.fatal.fix}  [log: {self._log.fatal_line[:200]}]")
                    return False
                code = self.engine.exit_code()
                if code is not None:
                    self._read_log(log_path, offset)
                    self.engine.stop()
                    self.fail(f"the engine exited during start-up (code {code}); last log lines:\n{self.engine.tail()}")
                    return False
                if self._log.phase and self._log.phase.key == "api" and self._healthy(http, served):
                    return True
                time.sleep(0.5)
        self.engine.stop()
        self.fail(
            f"the engine was not healthy after {self.settings.engine.start_timeout_s:.0f} s "
            f"(engine.start_timeout_s); see {log_path}"
        )
        return False

    def _healthy(self, http: httpx.Client, served: str) -> bool:
        try:
            if http.get(f"{root_url(self.base_url)}/health").status_code != 200:
                return False
            models = http.get(f"{self.base_url}/models", headers=headers(self.settings.engine.api_key)).json()
        except (httpx.HTTPError, ValueError):
            return False
        return any(m.get("id") == served for m in models.get("data", []))

    def _read_log(self, path: Path, offset: int) -> int:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            return offset
        end = chunk.rfind(b"\n") + 1
        for raw in chunk[:end].decode(errors="replace").splitlines():
            phase = self._log.feed(raw)
            if phase:
                self.update(phase.state, phase.label, phase.progress)
        return offset + end

    def _warm_up(self) -> bool:
        assert self.planned is not None
        plan = self.planned.plan
        if not self.settings.engine.warmup:
            record = WarmupRecord(disabled=True)
        else:
            self.update("warming", "warming up", 0.92)

            def progress(msg: str, frac: float) -> None:
                self.update("warming", f"warm-up: {msg}", 0.92 + 0.07 * frac)

            try:
                record = asyncio.run(
                    warm_up(
                        self.base_url,
                        plan.served_name,
                        plan,
                        users=self.settings.workload.users,
                        prompt_tokens=self.settings.workload.prompt_tokens,
                        sampling={"temperature": self.settings.app.temperature, "top_p": self.settings.app.top_p},
                        api_key=self.settings.engine.api_key,
                        on_progress=progress,
                    )
                )
            except (WarmupError, httpx.HTTPError) as err:
                assert self.engine is not None
                self.engine.stop()
                self.fail(f"warm-up failed: {err}")
                return False
        self.status.warmup = record
        self.run_dir.write_warmup(record)
        if not record.disabled:
            self.display.done()
            self.say(
                f"warm-up: first request TTFT {record.first_ttft_s * 1000:.0f} ms, steady "
                f"{record.steady_ttft_s * 1000:.0f} ms ({record.first_over_steady}x), "
                f"{record.requests} requests in {record.duration_s:.1f} s"
            )
        return True

    # -- after ready ---------------------------------------------------------------------
    def check(self) -> bool:
        """False (and status failed) once the engine has died."""
        assert self.engine is not None
        code = self.engine.exit_code()
        if code is None:
            return True
        self.engine.stop()
        self.fail(f"the engine exited unexpectedly (code {code}); last log lines:\n{self.engine.tail()}")
        self.say(f"error: {self.status.error}")
        return False

    def _start_cluster(self, plan: Plan) -> None:
        """Ray head here, the worker line for every other node, then wait until all joined."""
        self.ray = RayHead(self.settings.engine.python, plan, self.run_dir.path)
        for line in worker_lines(plan, self.ray.ip):
            self.say(f"on each worker node run: {line}")
        if self.ray.ip.startswith("127."):
            self.say("note: this node's name resolves to a loopback address; use its network address in that line")
        self.ray.start()
        self.update("starting", f"Ray head at {self.ray.address}", 0.04)
        self.ray.wait_for_workers(self.settings.engine.start_timeout_s, lambda msg: self.update(detail=msg))

    def stop(self) -> None:
        if self.engine:
            self.engine.stop()
        if self.ray:
            self.ray.stop()
        if self.status.state != "failed":
            self.update("stopped", "stopped", self.status.progress)
            self.display.done()


@contextmanager
def logged_server(settings: Settings, log_path: Path) -> Iterator[Server]:
    """A Server whose terminal output goes to a file (tune, benchmarks); stopped on exit."""
    with open(log_path, "w") as log:
        server = Server(settings, say=lambda msg: print(msg, file=log, flush=True))
        server.display = Display(server.t0, stream=log)
        try:
            yield server
        finally:
            server.stop()


def run_serve(settings: Settings) -> int:
    """The ``serve`` command: start, print ``ready: URL``, then watch until stopped."""
    server = Server(settings)
    try:
        if not server.start():
            print(f"error: {server.status.error}", file=sys.stderr)
            return 1
        print(f"ready: {server.base_url}", flush=True)
        while server.check():
            time.sleep(1.0)
        return 1
    finally:
        server.stop()
