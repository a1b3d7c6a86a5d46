"""``bench``: load the running engine (and optionally the page) at several concurrencies."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from backend.cli.options import above_zero, add_client_processes, add_served_model, at_least_one
from backend.engine_api import in_words
from backend.errors import EngineDown, EngineNotReady, UsageError
from backend.measure.bench import (
    DEFAULT_LEVELS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIX,
    KEEPALIVE_VARIANTS,
    BenchOptions,
    BenchReport,
    bench_engine,
    cap_levels,
    parse_levels,
    table,
    this_machine,
)
from backend.measure.expected import expect_levels
from backend.measure.levels import LEVEL_TIME_CAP_S, Target
from backend.measure.plots import plot_bench
from backend.runtime.rundir import RunDir
from config.compare import PLAN_LABEL
from config.performance.costs import HostCosts, default_costs
from config.plan import PINNABLE
from config.settings import Settings

NAME = "bench"
HELP = "load the running engine at several concurrencies; table, bench.json, bench.png"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="engine base URL (default: the running engine's, from the status file)")
    add_served_model(p)
    p.add_argument("--concurrency", default=",".join(map(str, DEFAULT_LEVELS)), help="levels, e.g. 1,4,16,64")
    p.add_argument(
        "--requests-per-level", type=at_least_one, help="requests per level (default max(8, 2 x concurrency))"
    )
    p.add_argument(
        "--max-tokens", type=at_least_one, default=DEFAULT_MAX_TOKENS, help="reply tokens per request (fixed)"
    )
    p.add_argument("--prompt-mix", default=",".join(DEFAULT_MIX), help="short,medium,long and/or token counts")
    p.add_argument("--page", metavar="URL", help="also drive the Chainlit page at URL (e.g. http://127.0.0.1:8080)")
    p.add_argument("--keepalive", choices=sorted(KEEPALIVE_VARIANTS), default="on", help="direct client keep-alive")
    p.add_argument(
        "--time-cap-s", type=above_zero, default=LEVEL_TIME_CAP_S, help="no new request after this, per level"
    )
    add_client_processes(p)
    p.add_argument("--out", help="output directory (default bench-results/<timestamp>)")
    p.add_argument("--label", default="", help="free text stored with the results")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also the setup `up --compare` runs beside the plan: both measured level by level, in turn",
    )
    p.add_argument(
        "--costs",
        metavar="FILE|defaults",
        help="predict with these host costs (another run's calibrated/*.json, or 'defaults') instead of the run's own",
    )


def running_target(
    settings: Settings, url: str | None, model: str | None, elsewhere: str = "pass --url and --served-model"
) -> tuple[str, str, dict[str, Any]]:
    """URL, served name and what the status file and plan.json say about the engine there.
    ``elsewhere``: how the command reaches an engine this run dir did not start (its flags)."""
    run_dir = settings.engine.run_dir
    status = RunDir(run_dir).status()
    context: dict[str, Any] = {"notes": []}
    same = status is not None and (url is None or url.rstrip("/") == status.base_url.rstrip("/"))
    if status is not None and same:
        if status.state != "ready":
            raise EngineNotReady(
                f"the engine in {run_dir} is {status.state}: {status.error or status.detail}; start it with `serve`"
            )
        context["hardware"] = status.hardware
        context["demo"] = status.demo
        context["warmup"] = status.warmup.model_dump() if status.warmup else None
        context["expected"] = status.expected
        context["running"] = plan = RunDir(run_dir).plan()
        context["plan"] = (
            {"summary": plan.summary(), "hardware": plan.hardware, "device": plan.device}
            | {k: getattr(plan, k) for k in PINNABLE}
            if plan is not None
            else {"summary": status.plan_summary}
        )
        url = url or status.base_url
        model = model or status.served_name
    elif url is None:
        raise EngineNotReady(
            f"no running engine found in {run_dir} (status file); start one with `python -m backend serve` "
            f"or {elsewhere}"
        )
    else:
        context["notes"].append(f"{url} is not the engine of {run_dir}: no plan or hardware recorded")
    if not model:
        raise UsageError("--served-model: the served model name is not known for this URL; pass --served-model NAME")
    return url, model, context


def admits(plan: dict[str, Any]) -> int | None:
    """Requests a running plan admits at once (max_num_seqs x replicas); None when no plan is known."""
    return plan["max_num_seqs"] * plan.get("data_parallel_size", 1) if plan.get("max_num_seqs") else None


def compared_setups(settings: Settings, plan_target: Target, plan: dict[str, Any]) -> list[tuple[str, Target, dict]]:
    """The plan and the setup ``up --compare`` runs beside it, as the plan's status names it."""
    status = RunDir(settings.engine.run_dir).status()
    if status is None or status.compared is None:
        raise EngineNotReady(
            f"--compare: the run in {settings.engine.run_dir} compares no setup beside the plan; start it with "
            "`up --compare defaults` (or KEY=VALUE ...)"
        )
    engine = settings.engine.model_copy(update={"run_dir": Path(status.compared.run_dir)})
    url, model, context = running_target(settings.model_copy(update={"engine": engine}), None, None)
    other = Target(url, model, settings.engine.api_key)
    return [(status.setup or PLAN_LABEL, plan_target, plan), (status.compared.label, other, context.get("plan", {}))]


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.max_tokens < 1 or (args.requests_per_level is not None and args.requests_per_level < 1):
        raise UsageError("--max-tokens and --requests-per-level: at least 1")
    if args.time_cap_s <= 0:
        raise UsageError(f"--time-cap-s {args.time_cap_s}: must be more than 0")
    levels = parse_levels(args.concurrency)
    url, model, context = running_target(settings, args.url, args.served_model)
    plan = context.get("plan", {})
    setups = compared_setups(settings, Target(url, model, settings.engine.api_key), plan) if args.compare else []
    caps = [admits(p) for p in [plan, *(s[2] for s in setups)]]
    cap = None if None in caps else min(c for c in caps if c is not None)
    levels, cap_note = cap_levels(levels, cap)
    notes: list[str] = list(context.pop("notes"))
    if cap_note:
        notes.append(cap_note)
        print(f"note: {cap_note}")
    if cap is None:
        notes.append("no plan known for this engine: concurrency levels not capped")
    if args.page:
        try:
            import socketio  # noqa: F401
        except ImportError:
            raise UsageError("--page needs python-socketio in this Python (pip install python-socketio)") from None
    mix = [m.strip() for m in args.prompt_mix.split(",") if m.strip()]
    out = Path(args.out) if args.out else Path("bench-results") / datetime.now().strftime("%Y%m%d-%H%M%S")
    print(f"bench: {url} model {model}; levels {', '.join(map(str, levels))}; out {out}")
    options = BenchOptions(
        levels=tuple(levels),
        requests_per_level=args.requests_per_level,
        max_tokens=args.max_tokens,
        prompt_mix=tuple(mix),
        prompt_tokens=settings.workload.prompt_tokens,
        keepalive=args.keepalive,
        page_url=args.page,
        page_keepalive=settings.app.keepalive,
        time_cap_s=args.time_cap_s,
        device=plan.get("device", "cuda"),
        processes=args.client_processes,
    )
    try:
        pairs = [(name, aimed) for name, aimed, _ in setups]
        report = bench_engine(Target(url, model, settings.engine.api_key), options, setups=pairs)
    except ValueError as err:
        raise UsageError(str(err)) from None
    except httpx.HTTPError as err:
        raise EngineDown(f"cannot reach the engine at {url}: {in_words(err)}") from None
    forecast, running = context.get("expected"), context.get("running")
    if forecast is not None and running is not None and args.costs:
        forecast = forecast.model_copy(update={"costs": host_costs(args.costs, running.device)})
    if forecast is not None and running is not None:
        expect_levels(report.results, report.config, forecast, running, setups[0][0] if setups else "")
        notes.append(f"predicted with host costs: {forecast.costs.source}")
    else:
        notes.append("no prediction: the engine's status holds none (not started by this run directory's serve)")
    report.label = args.label
    report.hardware = context.get("hardware") or this_machine()
    report.plan = plan
    report.demo = context.get("demo")
    report.warmup = context.get("warmup")
    report.notes = notes
    report.setups = {name: {"base_url": t.base_url, "model": t.model, "plan": p} for name, t, p in setups}
    print()
    print(table(report))
    json_path, png = write_report(report, out)
    for note in report.notes:
        print(f"note: {note}")
    print(f"wrote {json_path}" + (f" and {png}" if png else ""))
    errors = sum(r.errors for r in report.results)
    return 1 if errors else 0


def host_costs(spec: str, device: str) -> HostCosts:
    """``--costs``: 'defaults' (the engine kind's), or a calibration file."""
    if spec == "defaults":
        return default_costs(device)
    try:
        return HostCosts.model_validate_json(Path(spec).read_text())
    except OSError as err:
        raise UsageError(f"--costs {spec}: {err.strerror or err}") from None
    except ValueError:
        raise UsageError(f"--costs {spec}: not a file of host costs (a run's calibrated/*.json)") from None


def write_report(report: BenchReport, out: Path) -> tuple[Path, Path | None]:
    """bench.json and bench.png in ``out``; the PNG is None (with a note in the report) without matplotlib."""
    out.mkdir(parents=True, exist_ok=True)
    png: Path | None = out / "bench.png"
    note = plot_bench(report, out / "bench.png")
    if note:
        report.notes.append(note)
        png = None
    json_path = out / "bench.json"
    json_path.write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    return json_path, png
