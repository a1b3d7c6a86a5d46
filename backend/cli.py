"""``python -m backend <command>``: plan, serve, status, up, demo-model, bench, verify, tune.

Every command builds one ``Settings`` from the same flags, so ``--model``, ``--hardware``
and ``--set`` mean the same thing everywhere. Bad input: exit status 2, one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from config.settings import Settings, SettingsError, fail, load_settings

Handler = Callable[[argparse.Namespace, Settings], int]


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan options")
    g.add_argument("--model", help="Hugging Face id, local directory, or 'demo'")
    g.add_argument("--hardware", help="'auto' (detect), a profile name (see `profiles`), or a profile .toml file")
    g.add_argument("--objective", choices=["latency", "throughput", "balanced"])
    g.add_argument("--context", type=int, help="wanted context length in tokens")
    g.add_argument("--users", type=int, help="expected concurrent users")
    g.add_argument("--prompt-tokens", type=int, help="typical prompt length")
    g.add_argument("--reply-tokens", type=int, help="typical reply length")
    g.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="pin a plan value, e.g. tensor_parallel_size=2"
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    pins: dict[str, str] = {}
    for item in getattr(args, "set", []) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--set {item!r}: expected KEY=VALUE, e.g. --set tensor_parallel_size=2")
        pins[key.strip()] = value.strip()
    flat: dict[str, Any] = {
        "model.id": getattr(args, "model", None),
        "engine.hardware": getattr(args, "hardware", None),
        "workload.objective": getattr(args, "objective", None),
        "workload.context": getattr(args, "context", None),
        "workload.users": getattr(args, "users", None),
        "workload.prompt_tokens": getattr(args, "prompt_tokens", None),
        "workload.reply_tokens": getattr(args, "reply_tokens", None),
        "engine.port": getattr(args, "engine_port", None),
        "app.port": getattr(args, "app_port", None),
    }
    if pins:
        flat["engine.pins"] = pins
    if getattr(args, "no_warmup", False):
        flat["engine.warmup"] = False
    return flat


def cmd_plan(args: argparse.Namespace, settings: Settings) -> int:
    from backend.report import print_plan
    from config.pipeline import plan_for

    model_path = None
    if settings.model.id == "demo":
        from backend.resolve import ensure_demo

        model_path = ensure_demo(settings)
    planned = plan_for(settings, model_path=model_path)
    if args.json:
        data = planned.plan.as_json()
        data["notes"] = planned.notes
        print(json.dumps(data, indent=2))
    else:
        print_plan(planned)
    return 0


def cmd_profiles(args: argparse.Namespace, settings: Settings) -> int:
    from config.hardware import list_profiles, load_profile

    for name in list_profiles():
        print(f"{name:22} {load_profile(name).name}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m backend", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="print the launch plan for this (or a named) hardware")
    _add_plan_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.set_defaults(handler=cmd_plan)

    p = sub.add_parser("profiles", help="list the shipped hardware profiles")
    p.set_defaults(handler=cmd_profiles)

    from backend import commands as runtime

    runtime.register(sub, _add_plan_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from config.hardware import HardwareError
    from config.model import ModelReadError
    from config.planner import PlanError

    try:
        settings = load_settings(_overrides(args))
        handler: Handler = args.handler
        return handler(args, settings)
    except (SettingsError, HardwareError, ModelReadError, PlanError) as err:
        fail(str(err))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0
