"""``predict``: what a plan delivers at several loads, beside ``vllm serve``'s defaults on the same hardware
(and on a GPU beside ``vllm serve`` with ``VLLM_USE_RUST_FRONTEND=1``).

The plan is made from the flags as ``plan`` makes it, or read from a file (``plan --json``'s output or a
run's ``plan.json``); ``--hardware`` and ``--model`` say what it runs on; ``--at`` lists the loads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from backend.cli.options import add_plan_options, at_least_one
from backend.errors import UsageError
from config.calibrated import costs_for
from config.hardware import resolve_hardware
from config.performance.layout import layout_of, vllm_defaults
from config.performance.prediction import Load, Prediction, predict
from config.performance.text import figure, number
from config.pipeline import plan_for, read_model_shape
from config.plan import Plan
from config.settings import Settings

NAME = "predict"
HELP = "predict a plan's TTFT, TPOT and tokens/s at several loads, beside vLLM's defaults (and its Rust frontend)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    p.add_argument("--plan-file", metavar="FILE", help="a plan (plan --json's output, or a run's plan.json)")
    p.add_argument("--at", default="", help="loads in users, e.g. 1,16,128,256 (default: 1 and --users)")
    p.add_argument("--requests", type=at_least_one, help="requests per load (default max(32, 4 x users))")
    p.add_argument(
        "--sessions",
        choices=("user", "request"),
        default="user",
        help="user: each user's requests one conversation, kept on one engine by the router (the page, bench); "
        "request: every request a conversation of its own, as vllm bench serve sends them (the router takes "
        "them to the engines in turn)",
    )
    p.add_argument(
        "--greedy",
        action="store_true",
        help="the requests' tokens chosen greedily (temperature 0, as bench sends them); default: drawn at random, "
        "as the page draws and as vllm bench serve gets them from a checkpoint whose generation config samples",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def levels(text: str, users: int) -> list[int]:
    if not text.strip():
        return sorted({1, users})
    try:
        found = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--at {text!r}: expected comma-separated whole numbers, e.g. 1,16,128") from None
    if not found or found[0] < 1:
        raise UsageError(f"--at {text!r}: every load is 1 user or more")
    return found


def run(args: argparse.Namespace, settings: Settings) -> int:
    w = settings.workload
    at = levels(args.at, w.users)
    if args.plan_file:
        path = Path(args.plan_file)
        try:
            plan = Plan.from_json(path.read_text(), where=str(path))
        except OSError as err:
            raise UsageError(f"--plan-file {path}: {err.strerror or err}") from None
        hardware = resolve_hardware(settings.engine.hardware)
        model, _ = read_model_shape(settings.model.id, settings.model.revision)
    else:
        model_path = None
        if settings.model.id == "demo":
            from backend.runtime.resolve import ensure_demo

            model_path = ensure_demo(settings)
        planned = plan_for(settings, model_path=model_path)
        plan, hardware, model = planned.plan, planned.hardware, planned.model
    costs, unusable = costs_for(settings.engine.run_dir, hardware.name, plan.device)
    ours, theirs = layout_of(plan, hardware), vllm_defaults(hardware, model, plan.dtype)
    rust = vllm_defaults(hardware, model, plan.dtype, rust_frontend=True) if hardware.has_gpu else None
    rows: list[tuple[Prediction, Prediction, Prediction | None]] = []
    for users in at:
        load = Load(
            users,
            (w.prompt_tokens,),
            w.reply_tokens,
            requests=args.requests,
            sessions=args.sessions,
            sampled=not args.greedy,
        )
        rows.append(
            (
                predict(ours, model, load, costs),
                predict(theirs, model, load, costs),
                predict(rust, model, load, costs) if rust else None,
            )
        )
    if args.json:
        data = {
            "plan": plan.summary(),
            "hardware": hardware.name,
            "costs": costs.model_dump(mode="json"),
            "levels": [
                {
                    "plan": p.model_dump(mode="json"),
                    "vllm_defaults": d.model_dump(mode="json"),
                    "vllm_rust_frontend": r.model_dump(mode="json") if r else None,
                }
                for p, d, r in rows
            ],
        }
        print(json.dumps(data, indent=2))
        return 0
    print(f"plan: {plan.summary()} on {hardware.name}")
    each = "each request a conversation of its own" if args.sessions == "request" else "each user one conversation"
    drawn = "tokens chosen greedily" if args.greedy else "tokens drawn at random"
    print(
        f"load: {w.prompt_tokens}-token prompts, {w.reply_tokens}-token replies, each user sending the next at once, "
        f"{each}, {drawn}"
    )
    print(f"host costs: {costs.source}" + (f" ({unusable})" if unusable else ""))
    print()
    head = f"{'users':>6}  {'tok/s (band)':>22}  {'TTFT p50 ms':>20}  {'TTFT p99 ms':>20}  {'TPOT ms':>18}  "
    print(head + f"{'vllm serve tok/s':>16}  {'gain':>5}  {'+ Rust frontend':>15}  {'gain':>5}  bound")
    for p, d, r in rows:
        print(
            f"{p.users:>6}  {figure(p.output_tokens_per_s):>22}  {figure(p.ttft_p50_ms):>20}  "
            f"{figure(p.ttft_p99_ms):>20}  {figure(p.tpot_p50_ms):>18}  {number(d.output_tokens_per_s.point):>16}  "
            f"{_gain(p, d):>5}  {number(r.output_tokens_per_s.point) if r else '-':>15}  {_gain(p, r):>5}  "
            f"{p.bound_text}"
        )
    if rust:
        print("\n+ Rust frontend: vllm serve with VLLM_USE_RUST_FRONTEND=1 and nothing else")
    return 0


def _gain(ours: Prediction, other: Prediction | None) -> str:
    """The plan's tokens/s over another setup's: '1.87x'; '-' where there is none."""
    base = other.output_tokens_per_s.point if other else 0.0
    return f"{ours.output_tokens_per_s.point / base:.2f}x" if base > 0 else "-"
