"""Find and read a model's config.json: a local directory, a path to the file, or a Hugging Face id.

Hub ids are read through the local cache, the hub only when reachable (``config.model.hub``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from config.errors import ModelReadError
from config.model.config_json import model_from_config
from config.model.hub import hub_config
from config.model.spec import ModelSpec


def read_model(source: str | Path, *, revision: str | None = None) -> ModelSpec:
    """The shape of a local model directory, a config.json path, or a Hugging Face id."""
    name = str(source)
    path = Path(name).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelReadError(f"model '{name}': no config.json in {path}")
        return model_from_config(load_json(config_path, name), source=name, path=config_path)
    if path.is_file():
        return model_from_config(load_json(path, name), source=name, path=path)
    why = not_found(name)
    if why:
        raise ModelReadError(f"model '{name}': {why} ({path})")
    cached = hub_config(name, revision)
    return model_from_config(load_json(cached, name), source=name, path=cached)


def not_found(name: str) -> str | None:
    """Why ``name``, found nowhere on disk, can only have meant a local path (a typo that neither
    the hub nor the demo model may stand in for), or None when it may be a Hugging Face id."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.startswith(("/", ".", "~")) or "\\" in name or name.endswith("config.json"):
        return "no such directory or file"
    try:
        validate_repo_id(name)
    except HFValidationError:
        return "no such directory or file, and not a Hugging Face id (name or owner/name)"
    return None


def load_json(path: Path, name: str) -> dict[str, Any]:
    """A config.json's object; ModelReadError naming the model and the file otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ModelReadError(f"model '{name}': cannot read {path}: {err}") from None
    except json.JSONDecodeError as err:
        raise ModelReadError(f"model '{name}': {path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ModelReadError(f"model '{name}': {path} is not a JSON object")
    return data
