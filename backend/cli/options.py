"""Flags shared by several commands, and how they become settings overrides.

A flag means one thing in every command: ``--model`` is always the model to plan for (a
Hugging Face id, a directory or ``demo``), ``--served-model`` the name a running engine serves,
``--engine-port`` the engine's port and ``--page-port`` the chat page's.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from backend.errors import UsageError


def add_plan_options(p: argparse.ArgumentParser) -> None:
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


def add_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compare",
        metavar="defaults|KEY=VALUE ...",
        help="a second setup beside the plan, each on half of the machine: 'defaults' (vllm serve MODEL with its "
        'defaults) or the plan with these values pinned, e.g. "max_num_seqs=4 objective=latency"',
    )


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1-65535."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return int(text)


def add_engine_port(p: argparse.ArgumentParser, default: str = "8000") -> None:
    p.add_argument("--engine-port", dest="engine_port", type=int, help=f"engine port (default {default})")


def add_served_model(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--served-model", dest="served_model", metavar="NAME", help="served model name (default: from the status file)"
    )


def at_least_one(text: str) -> int:
    """argparse type: a whole number >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, at least 1")
    return n


def above_zero(text: str) -> float:
    """argparse type: a number > 0 (a time or a bound)."""
    try:
        x = float(text)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a number above 0")
    return x


def add_client_processes(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--client-processes",
        type=at_least_one,
        metavar="N",
        help="load-generating processes per level (default: one per 8 streams, at most a quarter of the cores)",
    )


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Flags as dotted settings keys (``None`` for flags this command does not have)."""
    pins: dict[str, str] = {}
    for item in getattr(args, "set", []) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set tensor_parallel_size=2")
        key = key.strip()
        if key in pins and pins[key] != value.strip():
            raise UsageError(f"--set {key} given twice ({pins[key]} and {value.strip()}): keep the one you mean")
        pins[key] = value.strip()
    flat: dict[str, Any] = {
        "model.id": getattr(args, "model", None),
        "engine.hardware": getattr(args, "hardware", None),
        "workload.objective": getattr(args, "objective", None),
        "workload.context": getattr(args, "context", None),
        "workload.users": getattr(args, "users", None),
        "workload.prompt_tokens": getattr(args, "prompt_tokens", None),
        "workload.reply_tokens": getattr(args, "reply_tokens", None),
        "engine.port": getattr(args, "engine_port", None),
        "app.port": getattr(args, "page_port", None),
        "app.host": getattr(args, "page_host", None),
    }
    if pins:
        flat["engine.pins"] = pins
    if getattr(args, "no_warmup", False):
        flat["engine.warmup"] = False
    return flat


def fail(message: str, code: int = 2) -> NoReturn:
    """End the command: ``error: message`` on stderr, exit status ``code`` (2: bad input)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)
