"""``python -m backend <command>``: the one command table, the parser and the error boundary.

Every command is a module with ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args, settings) -> int`` (the shape of vLLM's ``entrypoints/cli``). All build one
``Settings`` from the same flags. Library code raises :class:`ErniechatError`; this is the one
place that catches it: exit status 2 for bad input (1 for a failed run), one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from backend.cli import (
    bench,
    demo_model,
    page_floor,
    plan,
    predict,
    profiles,
    serve,
    startup,
    status,
    tune,
    up,
    verify,
)
from backend.cli.options import fail, overrides
from backend.errors import ErniechatError
from config.settings import load_settings

COMMANDS: tuple[ModuleType, ...] = (
    plan,
    predict,
    profiles,
    serve,
    up,
    status,
    demo_model,
    bench,
    startup,
    page_floor,
    verify,
    tune,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m backend", description="plan, serve, chat, measure")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.HELP)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(overrides(args))
        code: int = args.run(args, settings)
        return code
    except ErniechatError as err:
        fail(str(err), err.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
