"""``bench-page``: what the chat page adds to the engine, against Chainlit's own floor (an echo app)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

from backend.cli.bench import running_target
from backend.cli.options import at_least_one
from backend.errors import UsageError
from backend.measure.bench import parse_levels, this_machine
from backend.measure.page_floor import FloorOptions, as_json, measure_floor
from backend.runtime.processes.process import free_port, unwind_on_signals
from backend.runtime.up import ChatPage
from config.settings import ROOT, Settings

NAME = "bench-page"
HELP = "the page's added TTFT and inter-token gaps against direct and against a Chainlit echo app"
ECHO_APP = "backend/measure/echo_app.py"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--page", metavar="URL", default="http://127.0.0.1:8080", help="the running chat page (`up`)")
    p.add_argument("--concurrency", default="1,16", help="chats at once, e.g. 1,16")
    p.add_argument("--rounds", type=at_least_one, default=20, help="alternating rounds per level (default 20)")
    p.add_argument("--max-tokens", type=at_least_one, default=64, help="reply tokens (page and direct alike)")
    p.add_argument("--out", help="output directory (default bench-results/page-<time>)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    unwind_on_signals()
    if args.rounds < 1 or args.max_tokens < 1:
        raise UsageError("--rounds and --max-tokens: at least 1")
    levels = parse_levels(args.concurrency)
    url, model, _ = running_target(
        settings, None, None, elsewhere="name the run dir of the page's engine (ERNIECHAT_ENGINE__RUN_DIR)"
    )
    out = Path(args.out or f"bench-results/page-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    echo = ChatPage("127.0.0.1", free_port(), {}, out / "echo-app.log", app=ECHO_APP)
    echo.start()
    try:
        why = echo.wait_serving()
        if why:
            raise UsageError(f"the echo app did not start: {why}")
        opts = FloorOptions(
            base_url=url,
            model=model,
            page_url=args.page,
            echo_url=echo.url,
            sampling=replace(settings.app.sampling(), max_tokens=args.max_tokens),
            levels=levels,
            rounds=args.rounds,
            api_key=settings.engine.api_key,
        )
        figures = asyncio.run(measure_floor(opts))
    finally:
        echo.stop()
    for f in figures:
        d, pg, e = f.paths["direct"], f.paths["page"], f.paths["echo"]
        print(
            f"c={f.concurrency}: TTFT p50 direct {d.ttft_p50_ms} ms, page {pg.ttft_p50_ms} ms, echo {e.ttft_p50_ms} ms;"
            f" page adds {f.page_added_ttft_ms} ms (floor {f.echo_floor_ms} ms);"
            f" ITL page/direct x{f.page_itl_over_direct}"
        )
    options = {k: v for k, v in vars(args).items() if k != "run"}
    report = {"machine": this_machine(), "root": str(ROOT), "options": options, "levels": as_json(figures)}
    (out / "page.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out / 'page.json'}")
    return 0
