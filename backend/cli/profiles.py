"""``profiles``: the shipped hardware profiles, for planning hardware you do not have."""

from __future__ import annotations

import argparse

from config.hardware import list_profiles, load_profile
from config.settings import Settings

NAME = "profiles"
HELP = "list the shipped hardware profiles"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, settings: Settings) -> int:
    for name in list_profiles():
        print(f"{name:22} {load_profile(name).name}")
    return 0
