"""``tune``: measure candidate plans on this hardware; the best becomes a tuned profile."""

from __future__ import annotations

import argparse
from dataclasses import fields

from backend.cli.options import above_zero, add_client_processes, add_engine_port, add_plan_options, at_least_one
from backend.measure.tune.run import DEFAULT_BUDGET_S, DEFAULT_MAX_CANDIDATES, DEFAULT_MAX_TOKENS, TuneOptions, run_tune
from backend.runtime.processes.process import unwind_on_signals
from config.settings import Settings

NAME = "tune"
HELP = "measure candidate plans on this hardware; save the best as a tuned profile"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    p.add_argument("--objective-ms", type=above_zero, help="p99 TTFT bound in ms (default: none, highest tokens/s)")
    p.add_argument("--concurrency", type=at_least_one, help="target concurrent requests (default: --users)")
    p.add_argument("--requests", type=at_least_one, help="requests at the target (default max(8, 2 x concurrency))")
    p.add_argument(
        "--max-tokens", type=at_least_one, default=DEFAULT_MAX_TOKENS, help="reply tokens per request (fixed)"
    )
    add_client_processes(p)
    p.add_argument(
        "--max-candidates", type=at_least_one, default=DEFAULT_MAX_CANDIDATES, help="at most K, the default first"
    )
    p.add_argument("--time-budget-s", type=above_zero, default=DEFAULT_BUDGET_S, help="stop starting candidates after")
    add_engine_port(p, default="a free one")
    p.add_argument("--out", help="output directory (default bench-results/tune-<timestamp>)")
    p.add_argument("--dry-run", action="store_true", help="list the candidates and stop")


def run(args: argparse.Namespace, settings: Settings) -> int:
    unwind_on_signals()
    options = TuneOptions(**{f.name: getattr(args, f.name) for f in fields(TuneOptions)})
    return run_tune(settings, options)
