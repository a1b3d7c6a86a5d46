"""Hold a reply in place, so that tests about stopping it do not race the engine's speed.

``held(engine)`` stops vLLM's engine-core process (SIGSTOP): the request stays running, no
token is generated, and the page's HTTP stream to the engine stays open until the page
closes it. ``open_streams(pid, port)`` counts that process's established TCP connections to
the engine's port (``/proc``), so a test sees exactly when the page let go of a reply. Once
resumed (SIGCONT), the engine either finishes the reply (nobody closed it) or aborts it.
``Hold.step`` lets it run for a moment only: a test that needs a reply streaming before it holds
it starts held and steps, so the reply cannot run to its end while a busy machine delays the page;
``long_reply_held`` does that for a long reply asked in a chat tab.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from backend.engine_api import fetch_metrics, total
from backend.runtime.components.engines import ENGINE_CORE_TITLE
from backend.runtime.processes.groups import group_processes
from backend.runtime.status import read_status
from support.app_client import ChatClient
from support.services import Engine

ESTABLISHED = "01"


def engine_core_pids(run_dir: Path) -> list[int]:
    status = read_status(run_dir)
    assert status is not None and status.engine_pid, "no engine in this run dir"
    pids = [p for p in group_processes(status.engine_pid) if _comm(p).startswith(ENGINE_CORE_TITLE)]
    assert pids, f"no {ENGINE_CORE_TITLE} process in the engine's group"
    return pids


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return ""


@dataclass(frozen=True)
class Hold:
    """The stopped engine-core processes of one ``held`` block."""

    pids: list[int]

    def _signal(self, sig: signal.Signals) -> None:
        for pid in self.pids:
            os.kill(pid, sig)

    def step(self, seconds: float) -> None:
        """Let the engine run for ``seconds`` at its lowest priority (a few tokens), then stop it again."""
        with _lowest_priority(self.pids[0]):
            self._signal(signal.SIGCONT)
            try:
                time.sleep(seconds)
            finally:
                self._signal(signal.SIGSTOP)


@contextmanager
def held(run_dir: Path) -> Iterator[Hold]:
    """The engine core stopped for the block's duration; resumed on the way out, always."""
    hold = Hold(engine_core_pids(run_dir))
    hold._signal(signal.SIGSTOP)
    try:
        yield hold
    finally:
        hold._signal(signal.SIGCONT)


@contextmanager
def _lowest_priority(pid: int) -> Iterator[None]:
    """``pid``'s process group (an engine: its core, workers and API server) at nice 19 for the block,
    its session's CPU share too. On two busy cores a 20 ms step at normal priority lasted up to 1.8 s
    and the engine wrote 1,000 tokens meanwhile: where Linux shares the CPU between sessions first
    (autogroups), the test's session waited while the engine's ran, whatever the engine's own nice."""
    autogroup = Path(f"/proc/{pid}/autogroup")  # "/autogroup-1478 nice 0"; absent without autogroups
    group_nice = autogroup.read_text().split()[-1] if autogroup.exists() else None
    tasks = [int(t.name) for p in group_processes(os.getpgid(pid)) for t in Path(f"/proc/{p}/task").iterdir()]
    nice = {t: os.getpriority(os.PRIO_PROCESS, t) for t in tasks}
    try:
        if group_nice is not None:
            autogroup.write_text("19")
        for t in tasks:
            os.setpriority(os.PRIO_PROCESS, t, 19)
        yield
    finally:
        if group_nice is not None:
            autogroup.write_text(group_nice)
        for t, prior in nice.items():
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, t, prior)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def open_streams(pid: int, port: int, *, accepted: bool = False) -> int:
    """Established TCP connections from process ``pid`` to ``port`` on this machine; with
    ``accepted``, those ``pid`` serves on its own ``port`` instead."""
    inodes = _socket_inodes(pid)
    side = 1 if accepted else 2
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[side].rsplit(":", 1)[1], 16) == port and fields[3] == ESTABLISHED and fields[9] in inodes:
                n += 1
    return n


def wait_for_streams(pid: int, port: int, want: int, bound_s: float = 120.0) -> float:
    """Seconds until ``pid`` holds exactly ``want`` streams to ``port``; fails after ``bound_s``
    (a bound against hanging, not a measurement)."""
    t0 = time.monotonic()
    while (n := open_streams(pid, port)) != want:
        assert time.monotonic() - t0 < bound_s, f"{n} streams to :{port} after {bound_s:.0f} s, expected {want}"
        time.sleep(0.05)
    return time.monotonic() - t0


async def engine_counts(base_url: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=30) as http:  # read while a long reply runs or aborts
        s = await fetch_metrics(http, base_url)
    return {
        "running": total(s, "vllm:num_requests_running"),
        "waiting": total(s, "vllm:num_requests_waiting"),
        "finished": total(s, "vllm:request_success_total"),
        "generated": total(s, "vllm:generation_tokens_total"),
        "prompt_tokens": total(s, "vllm:prompt_tokens_total"),
    }


STEP_S = 0.02
LONGEST_STEP_S = 0.32
"""A step lets the engine run 20 ms, twice as long after each step in which it wrote nothing (on a
busy machine, at its lowest priority, it may get no CPU in 20 ms), at most 0.32 s."""

LONG_STORY = "Tell me a very long story."
"""Fixed: its greedy reply on the demo weights is visible text."""


@asynccontextmanager
async def long_reply_held(
    tab: ChatClient, engine: Engine, ask: Callable[[], Awaitable[str]] | None = None, tokens: int = 4000
) -> AsyncIterator[tuple[str, dict[str, float]]]:
    """Ask for a reply of ``tokens`` tokens (greedy on the demo weights: it runs to the end) and yield
    once the page shows it streaming, with the engine held; with the engine's counters from before.
    Until the tab has 5 tokens the engine runs only in short steps (``STEP_S``) at its lowest priority
    (``held``): however long a busy machine delays the page or this test, the reply cannot end before
    the test holds it. ``ask``: how the story is asked for (default: sent as a message); returns the id
    its reply answers."""
    await tab.set_settings(temperature=0.0, max_tokens=tokens)
    before = await engine_counts(engine.base_url)
    with held(engine.run_dir) as hold:
        mid = await (ask or (lambda: tab.send(LONG_STORY)))()

        def streaming() -> bool:
            reply = tab.reply_to(mid)
            return bool(reply and tab.tokens.get(reply["id"], 0) >= 5)

        steps, seconds, made_before = 0, STEP_S, 0.0
        while not streaming():
            made = (await engine_counts(engine.base_url))["generated"] - before["generated"]
            assert made < tokens // 2, f"the tab shows fewer than 5 tokens of a reply the engine made {made:.0f} of"
            seconds = STEP_S if steps == 0 or made > made_before else min(2 * seconds, LONGEST_STEP_S)
            made_before = made
            hold.step(seconds)  # blocks the loop meanwhile: nothing it runs is needed
            steps += 1
            with contextlib.suppress(AssertionError):
                await tab.wait_for(streaming, 0.3)
        made = (await engine_counts(engine.base_url))["generated"] - before["generated"]
        print(f"streaming after {steps} steps, {made:.0f} tokens made")
        assert made < tokens, f"the engine wrote the whole reply ({made:.0f} tokens) in {steps} steps"
        yield mid, before
