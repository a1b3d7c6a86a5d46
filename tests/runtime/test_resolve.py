"""Which weights ``serve`` takes: a directory, the Hugging Face cache, else the demo model, said
loudly. A path that does not exist is a typo to report, never a reason to serve random weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from support.services import DEMO_DIR, ENGINE_PYTHON, clear_settings_env

from backend.runtime.resolve import damaged_weights, resolve_model
from config.errors import ModelReadError
from config.settings import Settings, load_settings


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings on a machine without the hub and with an empty cache; the demo goes to a fresh dir."""
    clear_settings_env(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)  # so a hub id cannot be a relative directory
    settings = load_settings()
    settings.engine.python = ENGINE_PYTHON
    settings.model.demo_dir = tmp_path / "demo"
    return settings


@pytest.mark.parametrize(
    ("model_id", "why"),
    [
        ("/no/such/model", "no such directory"),
        ("./typo", "no such directory"),
        ("~/no-such-model-here", "no such directory"),
        ("models/ernie/v2", "no such directory or file, and not a Hugging Face id"),
        ("   ", "model id is empty"),
    ],
)
def test_a_missing_directory_is_an_error_not_the_demo(offline: Settings, model_id: str, why: str) -> None:
    offline.model.id = model_id
    with pytest.raises(ModelReadError, match=why):
        resolve_model(offline)
    assert not offline.model.demo_dir.exists()


def test_a_file_is_refused_with_the_directory_to_give(offline: Settings, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    offline.model.id = str(tmp_path / "m" / "config.json")
    with pytest.raises(ModelReadError, match=r"a file; give the directory that holds its config\.json"):
        resolve_model(offline)


def test_a_hub_id_out_of_reach_serves_the_demo_and_says_why(offline: Settings) -> None:
    offline.model.id = "baidu/ERNIE-4.5-0.3B-PT"
    offline.model.demo_dir = DEMO_DIR  # the suite's demo checkpoint: written once, then a no-op
    resolved = resolve_model(offline)
    assert resolved.demo and Path(resolved.path) == DEMO_DIR.absolute()
    assert resolved.note is not None
    assert "not in the local Hugging Face cache and the hub cannot be reached (offline: HF_HUB_OFFLINE is set)" in (
        resolved.note
    )
    assert "serving the built-in DEMO model" in resolved.note
    offline.model.demo_fallback = False
    with pytest.raises(ModelReadError, match="not in the local Hugging Face cache"):
        resolve_model(offline)


def test_a_relative_demo_dir_is_the_callers(offline: Settings, tmp_path: Path) -> None:
    """``demo-model DIR`` writes under the directory it was run from, not the project's."""
    offline.model.demo_dir = Path("rel-demo")
    offline.model.id = "demo"
    resolved = resolve_model(offline)
    assert Path(resolved.path) == tmp_path / "rel-demo" and (tmp_path / "rel-demo" / "config.json").is_file()


def safetensors_bytes() -> bytes:
    """A valid safetensors file: one float32 tensor of 4 values."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(16)


GOOD = safetensors_bytes()


NOT_A_HEADER = "its header is not a safetensors header (not JSON, or a tensor without its data offsets)"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (GOOD[:-5], f"its tensors need {len(GOOD)} bytes, the file holds {len(GOOD) - 5}"),
        (GOOD + b"x", f"its tensors need {len(GOOD)} bytes, the file holds {len(GOOD) + 1}"),
        (GOOD[:20], f"its header wants {len(GOOD) - 24} bytes, the file holds 20"),
        (struct.pack("<Q", 2**40) + bytes(8), f"its header wants {2**40} bytes, over safetensors' limit of 100000000"),
        (b"<html>", "6 bytes, less than a header"),
        (struct.pack("<Q", 3) + b"[1]", NOT_A_HEADER),
        (struct.pack("<Q", 4) + b"{x}!", NOT_A_HEADER),
    ],
    ids=[
        "cut-short",
        "a-byte-more",
        "header-cut",
        "header-too-big",
        "not-safetensors",
        "header-not-a-mapping",
        "header-not-json",
    ],
)
def test_a_damaged_weights_file_is_named_before_any_engine_starts(
    offline: Settings, tmp_path: Path, content: bytes, why: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "a.safetensors").write_bytes(GOOD)
    (model / "b.safetensors").write_bytes(content)
    assert damaged_weights(model) == (
        f"b.safetensors is damaged (cut short or not safetensors: {why}): "
        "download the model again (or copy its *.safetensors files whole), or use --model demo"
    )
    offline.model.id = str(model)
    with pytest.raises(ModelReadError, match=f"model '{model}': b.safetensors is damaged"):
        resolve_model(offline)
    (model / "b.safetensors").write_bytes(GOOD)
    assert damaged_weights(model) is None and resolve_model(offline).path == str(model.resolve())
