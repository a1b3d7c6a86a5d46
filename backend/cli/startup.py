"""``bench-startup``: start-up time and the first user's TTFT, with and without warm-up."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from backend.cli.options import add_plan_options
from backend.measure.bench import this_machine
from backend.measure.plots import plot_startup
from backend.measure.startup_bench import measure_start
from backend.runtime.process import unwind_on_signals
from config.settings import Settings

NAME = "bench-startup"
HELP = "start-up time and first-user TTFT, with and without warm-up"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    p.add_argument("--out", help="output directory (default bench-results/startup-<time>)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    unwind_on_signals()
    out = Path(args.out or f"bench-results/startup-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for warmup in (True, False):
        print(f"starting with warm-up {'on' if warmup else 'off'} ...", flush=True)
        run = measure_start(settings, warmup=warmup, run_dir=out / f"engine-warmup-{'on' if warmup else 'off'}")
        runs.append(run)
        if run["ok"]:
            print(
                f"  ready in {run['ready_s']:.1f} s; first user TTFT {run['first_user_ttft_s'] * 1000:.0f} ms, "
                f"steady {run['steady_ttft_s'] * 1000:.0f} ms",
                flush=True,
            )
        else:
            print(f"  failed: {run['error']}", flush=True)
    report = {"machine": this_machine(), "model": settings.model.id, "runs": runs}
    (out / "startup.json").write_text(json.dumps(report, indent=2))
    note = plot_startup(runs, out / "startup.png")
    print(f"wrote {out / 'startup.json'}" + (f" ({note})" if note else f" and {out / 'startup.png'}"))
    return 0 if all(r["ok"] for r in runs) else 1
