"""``verify``: the article's deployment checks against the running engine, as a pass/fail table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from backend.cli.options import at_least_one
from backend.errors import UsageError
from backend.measure.verify.run import DEFAULT_PROMPTS, DEFAULT_REPLY_TOKENS, render, run_verify
from config.settings import Settings

NAME = "verify"
HELP = "check the running engine: parallel sizes in its log, engine processes per GPU, jitter, GPU-Util, NCCL, links"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object: the checks and the overall result")
    p.add_argument("--page", metavar="URL", help="send the prompts through the chat page at URL (else to the engine)")
    p.add_argument(
        "--prompts", type=at_least_one, default=DEFAULT_PROMPTS, help="prompts of different lengths (default 10)"
    )
    p.add_argument(
        "--reply-tokens",
        type=at_least_one,
        default=DEFAULT_REPLY_TOKENS,
        help="tokens per reply (default 32; engine path)",
    )
    p.add_argument("--run-dir", type=Path, help="the engine's run dir (default: engine.run_dir)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.run_dir is not None:
        settings.engine.run_dir = args.run_dir
    if args.prompts < 2:
        raise UsageError("--prompts must be at least 2 (jitter needs two first-token times)")
    report = run_verify(settings, page_url=args.page, prompts=args.prompts, reply_tokens=args.reply_tokens)
    print(json.dumps(report.as_json(), indent=2) if args.json else render(report))
    return 1 if report.overall == "fail" else 0
