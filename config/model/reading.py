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
    if _looks_local(name):
        raise ModelReadError(f"model '{name}': no such directory or file {path}")
    cached = hub_config(name, revision)
    return model_from_config(load_json(cached, name), source=name, path=cached)


def _looks_local(name: str) -> bool:
    """A path the user meant as local: absolute, ./ ../ ~, or deeper than org/name."""
    return name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1 or name.endswith("config.json")


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
