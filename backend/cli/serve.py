"""``serve``: plan, start vLLM, warm it up; prints ``ready: URL`` and watches until stopped."""

from __future__ import annotations

import argparse

from backend.cli.options import add_engine_port, add_plan_options
from backend.runtime.process import unwind_on_signals
from config.settings import Settings

NAME = "serve"
HELP = "plan, start vLLM, warm it up; prints 'ready: URL'"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    add_engine_port(p)
    p.add_argument("--no-warmup", action="store_true", help="skip warm-up (to measure what it saves)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from backend.runtime.serve import run_serve

    unwind_on_signals()
    return run_serve(settings)
