"""``plan``: the launch plan for this (or a named) hardware, with a reason for every value."""

from __future__ import annotations

import argparse
import json

from backend.cli.options import add_plan_options
from backend.cli.plan_report import print_plan
from backend.runtime.expectation import planned_forecast
from config.calibrated import costs_for
from config.pipeline import plan_for
from config.settings import Settings

NAME = "plan"
HELP = "print the launch plan for this (or a named) hardware"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")


def run(args: argparse.Namespace, settings: Settings) -> int:
    model_path = None
    if settings.model.id == "demo":
        from backend.runtime.resolve import ensure_demo

        model_path = ensure_demo(settings)
    planned = plan_for(settings, model_path=model_path)
    costs, unusable = costs_for(settings.engine.run_dir, planned.hardware.name, planned.plan.device)
    if unusable:
        planned.notes.append(unusable)
    expected = planned_forecast(settings, planned, costs)
    if args.json:
        data = planned.plan.as_json()
        data["notes"] = planned.notes
        data["expected"] = expected.model_dump(mode="json", exclude={"hardware", "model"})
        print(json.dumps(data, indent=2))
    else:
        print_plan(planned, expected)
    return 0
