"""``plan``: the launch plan for this (or a named) hardware, with a reason for every value."""

from __future__ import annotations

import argparse
import json

from backend.cli.options import add_compare, add_plan_options
from backend.cli.plan_report import print_plan
from backend.runtime.expectation import planned_forecast
from config.calibrated import costs_for
from config.compare import PLAN_LABEL, parse_compare, plan_pair
from config.pipeline import plan_for
from config.settings import Settings

NAME = "plan"
HELP = "print the launch plan for this (or a named) hardware"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    add_compare(p)


def run(args: argparse.Namespace, settings: Settings) -> int:
    model_path = None
    if settings.model.id == "demo":
        from backend.runtime.resolve import ensure_demo

        model_path = ensure_demo(settings)
    notes: list[str] = []
    if args.compare is not None:
        pair = plan_pair(settings, parse_compare(args.compare), model_path or settings.model.id)
        setups, notes = [(PLAN_LABEL, pair.first), (pair.label, pair.second)], pair.notes
    else:
        setups = [("", plan_for(settings, model_path=model_path))]
    docs = []
    for label, planned in setups:
        costs, unusable = costs_for(settings.engine.run_dir, planned.hardware.name, planned.plan.device)
        if unusable:
            planned.notes.append(unusable)
        expected = planned_forecast(settings, planned, costs)
        if args.json:
            data = dict(planned.plan.as_json(), notes=planned.notes) | ({"setup": label} if label else {})
            data["expected"] = expected.model_dump(mode="json", exclude={"hardware", "model"})
            docs.append(data)
            continue
        if label:
            print(f"=== {label} ===")
        print_plan(planned, expected)
    if args.json:
        print(json.dumps({"setups": docs, "notes": notes} if notes else docs[0], indent=2))
        return 0
    for note in notes:
        print(f"note: {note}")
    return 0
