"""``demo-model DIR``: write the random-weight ERNIE-shaped checkpoint (tiny, or full size)."""

from __future__ import annotations

import argparse
from pathlib import Path

from backend.runtime.resolve import ensure_demo
from config.settings import Settings

NAME = "demo-model"
HELP = "write the random-weight ERNIE-shaped demo checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--full-size", action="store_true", help="the real 0.36 B shape (for GPU benchmarks)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    settings.model.demo_dir = args.dir
    settings.model.demo_full_size = args.full_size
    print(f"demo model: {ensure_demo(settings)}")
    return 0
