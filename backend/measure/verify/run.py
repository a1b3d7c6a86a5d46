"""``verify``: the article's checklist, automated, against the running engine.

Reads the running engine's status, plan and log; sends prompts of different lengths one at a
time (through the chat page when asked), then all at once while NVML is sampled (GPU plans);
and hands what it read to the checks (``checks``). The few functions that read NVML live in
``nvml``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx

from backend.engine_api import ChatResult, ask
from backend.errors import EngineNotReady
from backend.measure.verify.checks import (
    MPS_SERVER_COMM,
    PromptTiming,
    Report,
    check_jitter,
    check_link,
    check_memory_balance,
    check_nccl,
    check_parallel_sizes,
    check_processes,
    check_utilisation,
    gpu_skips,
)
from backend.measure.verify.nvml import Sampler, open_gpus, read_gpu, read_link, sampled
from backend.page_client import NO_VISIBLE_REPLY
from backend.prompts import prompt_lengths, prompt_of, prompts_of
from backend.runtime.rundir import RunDir
from backend.runtime.status import EngineStatus, read_status
from config.plan import Plan
from config.settings import Settings

DEFAULT_PROMPTS = 10
DEFAULT_REPLY_TOKENS = 32
VISIBLE_RESENDS = 3
LOAD_S = 3.0
"""GPU-Util is judged with all the prompts in flight at once for this long (see check_utilisation)."""


def descendants(root: int, parent_of: dict[int, int]) -> set[int]:
    """``root`` and every process below it, from a pid -> parent pid map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def process_parents(proc: Path = Path("/proc")) -> dict[int, int]:
    """pid -> parent pid for every process this machine shows."""
    out: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def mps_server_pids(pids: set[int], proc: Path = Path("/proc")) -> set[int]:
    """Those of ``pids`` that are NVIDIA's MPS server (by name; none where the PIDs are another namespace's)."""
    found: set[int] = set()
    for pid in pids:
        with suppress(OSError):
            if (proc / str(pid) / "comm").read_text().strip() == MPS_SERVER_COMM:
                found.add(pid)
    return found


# ============================================================================ sending prompts

Ask = Callable[[str], Awaitable[ChatResult]]


async def send_prompts(prompts: Sequence[str], lengths: Sequence[int], ask: Ask) -> list[PromptTiming]:
    """One prompt at a time (so each TTFT is the engine's, not a queue's).

    A reply with no visible text has no first-token time to measure (the page shows nothing
    until text comes; the demo checkpoint gave 2 in 100 greedy prompts such a reply before its
    rows for partial UTF-8 bytes were zeroed, and a real model may too), so that prompt is sent
    again under a fresh nonce, up to VISIBLE_RESENDS times, and the resends are counted."""
    out: list[PromptTiming] = []
    for text, words in zip(prompts, lengths, strict=True):
        res, resent = await ask(text), 0
        while res.error and res.error.startswith(NO_VISIBLE_REPLY) and resent < VISIBLE_RESENDS:
            res, resent = await ask(prompt_of(words)), resent + 1
        out.append(PromptTiming(words, res.ttft_s, res.error, resent))
    return out


def page_session_class() -> tuple[Any | None, str]:
    """``backend.page_client.PageSession`` where the page path can run, else None and why not."""
    try:
        from backend.page_client import PageSession
    except ImportError as err:
        return None, f"backend.page_client cannot be imported ({err})"
    if importlib.util.find_spec("socketio") is None:
        return None, "python-socketio is not installed"
    return PageSession, ""


async def run_prompts(
    base_url: str,
    served_name: str,
    prompts: Sequence[str],
    lengths: Sequence[int],
    *,
    page_url: str | None,
    reply_tokens: int,
    api_key: str | None,
    sampler: Sampler | None,
) -> tuple[list[PromptTiming], str]:
    """Send the prompts through the chat page (when asked and possible) or to the engine.

    On the page, each prompt gets a fresh tab (session): the page sends the conversation's
    history with every message, so ten messages in one tab would not be ten prompt lengths.
    """
    path_note = ""
    if page_url:
        session_class, why = page_session_class()
        if session_class is not None:
            from backend.page_client import PageError

            unreachable: list[str] = []

            async def ask_page(text: str) -> ChatResult:
                if unreachable:  # one failed connect is enough; don't wait out the rest
                    return ChatResult(error=unreachable[0])
                tab = session_class(page_url)
                try:
                    try:
                        await tab.connect()
                    except PageError as err:
                        unreachable.append(str(err))
                        raise
                    await tab.set_settings(max_tokens=max(16, reply_tokens), temperature=0.0)
                    with sampled(sampler, "prompts"):
                        return await tab.ask(text)
                except PageError as err:
                    return ChatResult(error=str(err))
                finally:
                    with suppress(Exception):
                        await tab.close()

            return await send_prompts(prompts, lengths, ask_page), f"chat page {page_url}"
        path_note = f" (not the page: {why})"
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=5.0)) as client:

        async def ask_engine(text: str) -> ChatResult:
            with sampled(sampler, "prompts"):
                return await ask(client, base_url, served_name, text, max_tokens=reply_tokens, api_key=api_key)

        return await send_prompts(prompts, lengths, ask_engine), f"engine {base_url}{path_note}"


async def load_engine(
    base_url: str, served_name: str, prompts: Sequence[str], *, reply_tokens: int, api_key: str | None, seconds: float
) -> tuple[int, list[str]]:
    """All prompts at once, each resent as soon as it is answered, for ``seconds``: (requests, errors)."""
    deadline = time.monotonic() + seconds
    errors: list[str] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=5.0)) as client:

        async def user(text: str) -> int:
            done = 0
            while time.monotonic() < deadline and not errors:
                res = await ask(client, base_url, served_name, text, max_tokens=reply_tokens, api_key=api_key)
                if res.error:
                    errors.append(res.error)
                done += 1
            return done

        counts = await asyncio.gather(*(user(t) for t in prompts))
    return sum(counts), errors


# ============================================================================ the command


def running_engine(run_dir: Path) -> tuple[EngineStatus, Plan, str]:
    """The ready engine's status, plan and log text; EngineNotReady when there is none."""
    status = read_status(run_dir)
    if status is None:
        raise EngineNotReady(f"no engine has been started from {run_dir}; start one with `python -m backend serve`")
    if status.state != "ready":
        raise EngineNotReady(f"the engine in {run_dir} is {status.state}, not ready: {status.error or status.detail}")
    plan = RunDir(run_dir).require_plan()
    try:
        log_text = Path(status.log_path).read_text(errors="replace")
    except OSError as err:
        log_text = ""
        print(f"warning: cannot read the engine log {status.log_path}: {err}", file=sys.stderr)
    return status, plan, log_text


def run_verify(
    settings: Settings,
    *,
    page_url: str | None = None,
    prompts: int = DEFAULT_PROMPTS,
    reply_tokens: int = DEFAULT_REPLY_TOKENS,
    nvml: Any | None = None,
) -> Report:
    """All checks against the engine in ``settings.engine.run_dir``; raises EngineNotReady when none is ready."""
    status, plan, log_text = running_engine(settings.engine.run_dir)
    lengths = prompt_lengths(prompts, max_words=max(1, (plan.max_model_len - reply_tokens) // 2))

    def send(sampler: Sampler | None) -> tuple[list[PromptTiming], str]:
        return asyncio.run(
            run_prompts(
                status.base_url,
                status.served_name,
                prompts_of(lengths),
                lengths,
                page_url=page_url,
                reply_tokens=reply_tokens,
                api_key=settings.engine.api_key,
                sampler=sampler,
            )
        )

    checks = [check_parallel_sizes(plan, log_text)]
    loaded_here = nvml is None
    nvml, handles, gpu_why = open_gpus(plan, nvml)
    try:
        if not handles:
            timings, path = send(None)
            skips = gpu_skips(gpu_why)
            checks += [*skips[:2], check_jitter(timings, path), skips[2], check_nccl(log_text, plan), skips[3]]
            return Report(status.base_url, status.plan_summary, path, checks)
        readings = [read_gpu(nvml, h, i) for i, h in handles.items()]
        engine_pids = descendants(status.pid, process_parents()) if status.pid else None
        if engine_pids is not None and not engine_pids & {p for r in readings for p in r.pids}:
            engine_pids = None  # NVML shows PIDs of another namespace: cannot tell whose they are
        mps = mps_server_pids({p for r in readings for p in r.pids})
        checks += [check_processes(readings, engine_pids, plan.engines_per_gpu, mps), check_memory_balance(readings)]
        with Sampler(nvml, handles) as sampler:
            timings, path = send(sampler)
            with sampler.during("load"):
                _, load_errors = asyncio.run(
                    load_engine(
                        status.base_url,
                        status.served_name,
                        prompts_of(lengths),
                        reply_tokens=reply_tokens,
                        api_key=settings.engine.api_key,
                        seconds=LOAD_S,
                    )
                )
        utilisation = check_utilisation(sampler.samples("load"), sampler.samples("prompts"))
        if load_errors:
            utilisation.result, utilisation.note = "fail", f"load requests failed: {load_errors[0][:200]}"
        checks += [check_jitter(timings, path), utilisation, check_nccl(log_text, plan)]
        for i, h in handles.items():
            link = read_link(nvml, h, i, plan.gpus, handles)
            if i in sampler.pcie:  # the link as it trained under load, not as it idles
                link.pcie_gen, link.pcie_width = sampler.pcie[i]
                link.under_load = True
            checks.append(check_link(link, [g for g in plan.gpus if g != i]))
        return Report(status.base_url, status.plan_summary, path, checks)
    finally:
        if nvml is not None and loaded_here:
            with suppress(nvml.NVMLError):
                nvml.nvmlShutdown()


def render(report: Report) -> str:
    """The table a person reads: check, result, measured, threshold, note."""
    head = ("check", "result", "measured", "threshold", "note")
    rows = [head] + [(c.name, c.result.upper(), c.measured, c.threshold, c.note) for c in report.checks]
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    lines = [f"engine:  {report.engine}  ({report.plan})", f"prompts: via {report.path}", ""]
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
        if n == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 4)
    skipped = [c for c in report.checks if c.result == "skip"]
    lines.append("")
    lines.append(
        f"overall: {report.overall.upper()}" + (f" ({len(skipped)} skipped: {skipped[0].note})" if skipped else "")
    )
    return "\n".join(lines)
