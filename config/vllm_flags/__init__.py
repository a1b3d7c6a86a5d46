"""``vllm serve``'s options, as the pinned GPU vLLM's own parser has them.

One JSON file per vLLM version (``vllm-<version>.json``), written by ``python -m config.vllm_flags``
run with that vLLM installed: option names, what each takes, its choices, ``--compilation-config``'s
keys and the ``VLLM_*`` environment variables. The tests check every GPU plan's command line
against the file of the version ``requirements-engine-gpu.txt`` pins, without a GPU or that vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from config.errors import ErniechatError

FOLDER = Path(__file__).resolve().parent


def load(version: str) -> dict[str, Any]:
    """The options table of vLLM ``version``; a clear error when none was written for it."""
    path = FOLDER / f"vllm-{version}.json"
    if not path.exists():
        have = ", ".join(sorted(p.stem.removeprefix("vllm-") for p in FOLDER.glob("vllm-*.json"))) or "none"
        raise ErniechatError(
            f"no options table for vLLM {version} ({path.name}; have: {have}): run "
            f"`python -m config.vllm_flags > config/vllm_flags/vllm-{version}.json` with vLLM {version} installed"
        )
    table: dict[str, Any] = json.loads(path.read_text())
    return table
