"""Runtime subcommands: serve, status, up, demo-model; bench, verify and tune register their own."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from backend.engine import unwind_on_signals
from config.settings import Settings


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from backend.serve import run_serve

    unwind_on_signals()
    return run_serve(settings)


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from backend.up import run_up

    unwind_on_signals()
    return run_up(settings)


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from backend.status import read_status

    status = read_status(settings.engine.run_dir)
    if status is None:
        if args.json:
            print(json.dumps({"state": "stopped", "detail": "no engine has been started"}))
        else:
            print("stopped: no engine has been started from this directory")
        return 3
    if args.json:
        print(status.model_dump_json(indent=2))
    else:
        age = time.time() - status.started_at
        print(f"{status.state}: {status.detail} ({status.progress:.0%}, {age:.0f} s since start)")
        if status.base_url:
            print(
                f"engine:  {status.base_url}  model {status.served_name}"
                + ("  [DEMO: random weights]" if status.demo else "")
            )
        if status.plan_summary:
            print(f"plan:    {status.plan_summary} on {status.hardware}")
        if status.warmup and not status.warmup.get("disabled"):
            w = status.warmup
            print(f"warm-up: first TTFT {w['first_ttft_s'] * 1000:.0f} ms, steady {w['steady_ttft_s'] * 1000:.0f} ms")
        if status.error:
            print(f"error:   {status.error}")
    return 0 if status.state == "ready" else 1


def cmd_demo_model(args: argparse.Namespace, settings: Settings) -> int:
    from backend.resolve import ensure_demo

    settings.model.demo_dir = args.dir
    settings.model.demo_full_size = args.full_size
    path = ensure_demo(settings)
    print(f"demo model: {path}")
    return 0


def register(sub: argparse._SubParsersAction, add_plan_options: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("serve", help="plan, start vLLM, warm it up; prints 'ready: URL'")
    add_plan_options(p)
    p.add_argument("--port", "--engine-port", dest="engine_port", type=int, help="engine port (default 8000)")
    p.add_argument("--no-warmup", action="store_true", help="skip warm-up (to measure what it saves)")
    p.set_defaults(handler=cmd_serve)

    p = sub.add_parser("up", help="serve, then the chat page once the engine is ready; Ctrl-C stops all")
    add_plan_options(p)
    p.add_argument("--port", dest="app_port", type=int, help="chat page port (default 8080)")
    p.add_argument("--engine-port", dest="engine_port", type=int, help="engine port (default 8000)")
    p.add_argument("--no-warmup", action="store_true", help="skip warm-up")
    p.set_defaults(handler=cmd_up)

    p = sub.add_parser("status", help="starting | loading | warming | ready | failed | stopped")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("demo-model", help="write the random-weight ERNIE-shaped demo checkpoint")
    p.add_argument("dir", type=Path)
    p.add_argument("--full-size", action="store_true", help="the real 0.36 B shape (for GPU benchmarks)")
    p.set_defaults(handler=cmd_demo_model)

    from backend import bench, startup_bench, tune, verify

    for module in (bench, startup_bench, verify, tune):
        module.register(sub, add_plan_options)
