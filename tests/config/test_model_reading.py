"""Reading a model's config.json: a directory, a file, or a hub id through the local cache."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from config.model import ModelReadError, read_model

DATA = Path(__file__).parents[1] / "data"
B = 10**9


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def test_read_model_from_a_directory_and_a_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((DATA / "ernie-4.5-0.3b-pt.json").read_text())
    from_dir = read_model(tmp_path)
    assert from_dir.source == str(tmp_path)
    assert from_dir.num_layers == 18 and from_dir.kv_bytes_per_token() == 18432
    from_file = read_model(str(tmp_path / "config.json"))
    assert from_file.param_count == from_dir.param_count


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelReadError, match=rf"^model '{missing}': no such directory or file"):
        read_model(missing)


def test_directory_without_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelReadError, match=rf"^model '{tmp_path}': no config.json in {tmp_path}$"):
        read_model(tmp_path)


@pytest.mark.parametrize(
    "key",
    [
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        "intermediate_size",
        "max_position_embeddings",
    ],
)
def test_config_without_required_key_is_a_clear_error(tmp_path: Path, key: str) -> None:
    config = {k: v for k, v in load("llama-3.1-8b").items() if k != key}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelReadError, match=rf"^model '{tmp_path}': config.json lacks '{key}'$"):
        read_model(tmp_path)


def test_invalid_json_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelReadError, match="is not valid JSON"):
        read_model(tmp_path)


def test_hub_id_offline_with_empty_cache_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)  # so 'baidu/...' cannot be a relative directory
    with pytest.raises(ModelReadError) as err:
        read_model("baidu/ERNIE-4.5-0.3B-PT")
    message = str(err.value)
    assert message.startswith("model 'baidu/ERNIE-4.5-0.3B-PT': not in the local Hugging Face cache")
    assert "offline" in message and "\n" not in message


def test_hub_id_offline_reads_the_cache_under_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--baidu--ERNIE-4.5-0.3B-PT"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((DATA / "ernie-4.5-0.3b-pt.json").read_text())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    m = read_model("baidu/ERNIE-4.5-0.3B-PT")
    assert m.source == "baidu/ERNIE-4.5-0.3B-PT" and m.num_layers == 18
    assert math.isclose(m.param_count / B, 0.36, rel_tol=0.02)
