"""``up``: serve, then the chat page once the engine is ready; one Ctrl-C stops all."""

from __future__ import annotations

import argparse

from backend.cli.options import add_compare, add_engine_port, add_plan_options
from backend.runtime.processes.process import unwind_on_signals
from config.compare import parse_compare
from config.settings import Settings

NAME = "up"
HELP = "serve, then the chat page once the engine is ready; Ctrl-C stops all"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    p.add_argument("--page-port", "--port", dest="page_port", type=int, help="chat page port (default 8080)")
    p.add_argument(
        "--host",
        dest="page_host",
        metavar="ADDRESS",
        help="chat page address (default 127.0.0.1, this machine only; 0.0.0.0: every interface, with a login)",
    )
    add_engine_port(p)
    p.add_argument("--no-warmup", action="store_true", help="skip warm-up")
    add_compare(p)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from backend.runtime.up import run_up

    compare = parse_compare(args.compare) if args.compare is not None else None
    unwind_on_signals()
    return run_up(settings, compare)
