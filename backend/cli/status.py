"""``status``: starting | loading | warming | ready | failed | stopped, with detail and warm-up."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from backend.runtime.status import EngineStatus, PageRecord, read_status
from config.performance.text import forecast_lines
from config.settings import Settings

NAME = "status"
HELP = "starting | loading | warming | ready | failed | stopped, and the chat page's processes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def page_line(page: PageRecord) -> str:
    """``page:    URL  up: process 12 up`` (with a front: ``front 11 up, chats 12 up, 13 down``)."""
    each = ", ".join(f"{'front' if p.role == 'front' else 'chats'} {p.pid} {p.state}" for p in page.processes)
    again = f" ({page.restarts} restart{'s' if page.restarts > 1 else ''})" if page.restarts else ""
    why = f" [{page.detail}]" if page.detail else ""
    return f"page:    {page.url}  {page.state}: {each or 'no process'}{again}{why}"


def run(args: argparse.Namespace, settings: Settings) -> int:
    status = read_status(settings.engine.run_dir)
    if status is None:
        if args.json:
            print(json.dumps({"state": "stopped", "detail": "no engine has been started"}))
        else:
            print("stopped: no engine has been started from this directory")
        return 3
    compared = read_status(Path(status.compared.run_dir)) if status.compared else None
    if args.json:
        data = status.model_dump(mode="json")
        if compared is not None:
            data["compared_status"] = compared.model_dump(mode="json")
        print(json.dumps(data, indent=2))
    else:
        show(status)
        if status.compared:
            print(f"\ncompared beside it: {status.compared.label} (run directory {status.compared.run_dir})")
            if compared is None:
                print("stopped: not started yet")
            else:
                show(compared)
    both = [status] + ([compared] if status.compared else [])
    return 0 if all(s is not None and s.state == "ready" for s in both) else 1


def show(status: EngineStatus) -> None:
    """One run's state, engine, plan, router, KV cache, warm-up and error."""
    age = time.time() - status.started_at
    known = f" ({status.progress:.0%}, {age:.0f} s since start)" if status.pid is not None else ""
    print(f"{status.state}: {status.detail}{known}")
    if status.base_url:
        print(
            f"engine:  {status.base_url}  model {status.served_name}"
            + ("  [DEMO: random weights]" if status.demo else "")
        )
    if status.plan_summary:
        print(f"plan:    {status.plan_summary} on {status.hardware}")
    if status.router:
        r = status.router
        print(f"router:  {r.url}  {r.policy} on {r.session_header}, pid {r.pid}")
        for e in status.engines:
            where = "in rotation" if e.in_rotation else "OUT of rotation"
            health = "healthy" if e.answers else "not answering"
            state = "" if e.state == "serving" else f"  [{e.state}: {e.detail}]"
            again = f" ({e.restarts} restart{'s' if e.restarts > 1 else ''})" if e.restarts else ""
            print(f"  {e.name}: {e.url}  {where}, {health}, load {e.load}{again}{state}")
    if status.page is not None:
        print(page_line(status.page))
    if status.startup and status.startup.kv_tokens is not None:
        kv, planned = status.startup.kv_tokens, status.startup.kv_tokens_planned
        print(f"KV:      {kv:,} tokens per engine, as vLLM allocated it (the plan's arithmetic: {planned:,})")
    w = status.warmup
    if w is not None and not w.disabled:
        print(f"warm-up: first TTFT {w.first_ttft_s * 1000:.0f} ms, steady {w.steady_ttft_s * 1000:.0f} ms")
    if status.expected is not None:
        print("expected:", *(f"  {line}" for line in forecast_lines(status.expected)), sep="\n")
    if status.error:
        print(f"error:   {status.error}")
