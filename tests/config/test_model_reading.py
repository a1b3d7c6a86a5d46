"""Reading a model's config.json: a directory, a file, or a hub id through the local cache."""

from __future__ import annotations

import json
import math
import re
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
    with pytest.raises(ModelReadError, match=rf"^{where(tmp_path)} lacks '{key}'$"):
        read_model(tmp_path)


def where(tmp_path: Path) -> str:
    """The start of every config.json error: the model, then the file it was read from."""
    return re.escape(f"model '{tmp_path}': {tmp_path / 'config.json'}")


def refused(tmp_path: Path, config: dict[str, Any], pattern: str) -> None:
    """read_model of a directory holding ``config`` fails with one line: the file, then ``pattern``."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelReadError) as err:
        read_model(tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert re.fullmatch(rf"{where(tmp_path)} {pattern}", message), message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_attention_heads", 0),  # no head_dim in Llama's config: once a ZeroDivisionError
        ("num_attention_heads", -4),
        ("num_hidden_layers", 0),
        ("hidden_size", 0),
        ("vocab_size", -1),
        ("intermediate_size", 0),
        ("num_key_value_heads", 0),
        ("head_dim", 0),
        ("max_position_embeddings", 0),
    ],
)
def test_count_below_one_is_a_clear_error(tmp_path: Path, key: str, value: int) -> None:
    config = {**load("llama-3.1-8b"), key: value}
    refused(tmp_path, config, rf"has '{key}': {value}; it must be at least 1")


def test_count_under_an_alias_is_named_as_written(tmp_path: Path) -> None:
    config = {k: v for k, v in load("llama-3.1-8b").items() if k != "num_attention_heads"}
    refused(tmp_path, {**config, "n_head": 0}, r"has 'n_head': 0; it must be at least 1")


@pytest.mark.parametrize(
    ("heads", "kv_heads", "pattern"),
    [
        (4, 3, r"has 'num_attention_heads': 4, not a multiple of 'num_key_value_heads': 3; .*"),
        (4, 8, r"has 'num_key_value_heads': 8, more than 'num_attention_heads': 4; .*"),
    ],
)
def test_heads_that_kv_heads_do_not_divide_are_a_clear_error(
    tmp_path: Path, heads: int, kv_heads: int, pattern: str
) -> None:
    config = {**load("llama-3.1-8b"), "num_attention_heads": heads, "num_key_value_heads": kv_heads}
    refused(tmp_path, config, pattern)


def test_architectures_as_one_string_is_that_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**load("llama-3.1-8b"), "architectures": "LlamaForCausalLM"}))
    assert read_model(tmp_path).architecture == "LlamaForCausalLM"  # not "L"


@pytest.mark.parametrize("value", [5, [5], {"name": "LlamaForCausalLM"}, True])
def test_architectures_not_names_is_a_clear_error(tmp_path: Path, value: object) -> None:
    config = {**load("llama-3.1-8b"), "architectures": value}
    refused(
        tmp_path, config, rf"has 'architectures': {re.escape(repr(value))}; expected a list of model class names .*"
    )


@pytest.mark.parametrize(
    "architecture",
    [
        "BertModel",
        "XLMRobertaModel",
        "T5EncoderModel",
        "WhisperForConditionalGeneration",
        "T5ForConditionalGeneration",
        "LlamaForSequenceClassification",
        "BertForMaskedLM",
    ],
)
def test_architecture_that_is_not_a_chat_model_is_refused(tmp_path: Path, architecture: str) -> None:
    config = {**load("llama-3.1-8b"), "architectures": [architecture]}
    pattern = rf"has 'architectures': \['{architecture}'\], not a causal language model; this project serves chat .*"
    refused(tmp_path, config, pattern)


@pytest.mark.parametrize(
    "architectures",
    [
        ["GPT2LMHeadModel"],
        ["Qwen2VLForConditionalGeneration"],
        ["Gemma3ForConditionalGeneration"],
        ["LlavaForConditionalGeneration"],
        ["InternVLChatModel"],
        ["ChatGLMModel"],
        ["MiniCPMV"],  # chat models whose class follows no naming rule: served, vLLM knows them
        ["NVLM_D"],
        ["LlamaModel", "LlamaForCausalLM"],
    ],
)
def test_chat_architectures_are_served(tmp_path: Path, architectures: list[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**load("llama-3.1-8b"), "architectures": architectures}))
    assert read_model(tmp_path).architecture == architectures[-1]


def test_every_test_model_is_a_chat_architecture() -> None:
    for path in DATA.glob("*.json"):
        assert read_model(path).architecture.endswith("ForCausalLM"), path


def test_config_without_architectures_is_read_as_before(tmp_path: Path) -> None:
    config = {k: v for k, v in load("llama-3.1-8b").items() if k != "architectures"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    m = read_model(tmp_path)
    assert m.architecture == "" and m.param_count == 8_030_261_248


@pytest.mark.parametrize("per_token", [0, 9, -1])
def test_moe_top_k_outside_one_to_experts_is_a_clear_error(tmp_path: Path, per_token: int) -> None:
    config = {**load("mixtral-8x7b"), "num_experts_per_tok": per_token}
    pattern = rf"has 'num_experts_per_tok': {per_token}; each token goes to 1 to 8 experts \('num_local_experts'\)"
    refused(tmp_path, config, pattern)


def test_negative_expert_count_is_a_clear_error(tmp_path: Path) -> None:
    config = {**load("mixtral-8x7b"), "num_local_experts": -8}
    refused(tmp_path, config, r"has 'num_local_experts': -8; it must be 0 \(a dense model\) or more")


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
