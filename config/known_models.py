"""Shapes of models the product is built around, for planning when the hub is out of reach.

Planning needs only ``config.json``. When a Hugging Face id is neither cached nor reachable,
a bundled copy of its published config lets ``plan`` still answer (and say so); serving
still needs the real weights or falls back to the demo model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_DIR = Path(__file__).parent / "known_models"


def known_config(model_id: str) -> dict[str, Any] | None:
    """The bundled config.json of ``model_id`` (e.g. ``baidu/ERNIE-4.5-0.3B-PT``), if any."""
    path = _DIR / (model_id.replace("/", "--") + ".json")
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def known_ids() -> list[str]:
    return sorted(p.stem.replace("--", "/") for p in _DIR.glob("*.json"))
