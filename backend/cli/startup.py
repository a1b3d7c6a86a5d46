"""``bench-startup``: start-up time and the first user's TTFT, with and without warm-up."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from backend.cli.options import add_plan_options
from backend.errors import UsageError
from backend.measure.bench import this_machine
from backend.measure.plots import plot_startup
from backend.measure.startup.bench import PAUSE_S, measure_start
from backend.measure.startup.records import StartupReport, StartupRun
from backend.runtime.processes.process import unwind_on_signals
from config.settings import Settings

NAME = "bench-startup"
HELP = "start-up time and first-user TTFT, with and without warm-up"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    p.add_argument("--out", help="output directory (default bench-results/startup-<time>)")
    p.add_argument("--warmup", choices=["both", "on", "off"], default="both", help="start with warm-up on, off or both")
    p.add_argument(
        "--idle",
        default="",
        help="idle rounds in seconds, in order, repeats allowed (e.g. 30,120,30,120): each path's first request after",
    )
    p.add_argument("--page", action="store_true", help="also start the chat page and time its first new chats")


def run(args: argparse.Namespace, settings: Settings) -> int:
    unwind_on_signals()
    out = Path(args.out or f"bench-results/startup-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    try:
        idle = [float(x) for x in args.idle.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--idle {args.idle!r}: seconds, comma-separated, e.g. 30,120") from None
    report = StartupReport(machine=this_machine(), model=settings.model.id, runs=[])
    for warmup in {"both": (True, False), "on": (True,), "off": (False,)}[args.warmup]:
        print(f"starting with warm-up {'on' if warmup else 'off'} ...", flush=True)
        run_dir = out / f"engine-warmup-{'on' if warmup else 'off'}"
        run = measure_start(settings, warmup=warmup, run_dir=run_dir, idle_s=idle, page=args.page)
        report.runs.append(run)
        if isinstance(run, StartupRun):
            print(
                f"  ready in {run.ready_s:.1f} s; first user TTFT {run.first_user_ttft_s * 1000:.0f} ms, "
                f"steady {run.steady_ttft_s * 1000:.0f} ms",
                flush=True,
            )
            for name, w in run.paths.items():
                after = w.paused_ttft_s
                paused = f", after {PAUSE_S:g} s idle {after * 1000:6.1f} ms" if after else ""
                print(
                    f"  {name:28} first {w.first_ttft_s * 1000:6.1f} ms, steady {w.steady_ttft_s * 1000:6.1f} ms"
                    + paused
                )
            for rnd in run.after_idle_s:
                page, w = next(iter(rnd.paths.items()))
                worst = max(rnd.paths.items(), key=lambda kv: kv[1].first_over_steady)
                over_paused = "-" if w.first_over_paused is None else w.first_over_paused
                print(
                    f"  after {rnd.slept_s:g} s idle (load {rnd.load1}): {page} first "
                    f"{w.first_ttft_s * 1000:.1f} ms, steady {w.steady_ttft_s * 1000:.1f} ms "
                    f"(x{w.first_over_steady}; x{over_paused} the requests after "
                    f"{PAUSE_S:g} s idle); worst path {worst[0]} x{worst[1].first_over_steady}",
                    flush=True,
                )
            footers = run.page_chat_footers_ms or [[] for _ in run.page_chat_ttfts_s]
            for i, ((first, *later), shown) in enumerate(zip(run.page_chat_ttfts_s, footers, strict=True)):
                seen = [x for x in later if x is not None]
                steady = statistics.median(seen) if seen else None
                ratio = f"x{first / steady:.2f}" if first and steady else "no visible text in one of them"
                split = (
                    "; footers (page / engine ms): " + ", ".join(f"{f[0]}/{f[1]}" if f else "-" for f in shown)
                    if shown
                    else ""
                )
                print(f"  page start {i + 1}: first new chat {first} s, later (median) {steady} s ({ratio}){split}")
        else:
            print(f"  failed: {run.error}", flush=True)
    (out / "startup.json").write_text(report.model_dump_json(indent=2))
    note = plot_startup(report.runs, out / "startup.png")
    print(f"wrote {out / 'startup.json'}" + (f" ({note})" if note else f" and {out / 'startup.png'}"))
    return 0 if all(r.ok for r in report.runs) else 1
