"""config.model (spec, params, config_json) against published config.json files (tests/data) and vLLM's KV formula.

The parameter totals are the published figures; where the model page lists the exact
safetensors total, the shape-derived count must reproduce it to the parameter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from config.model import ModelReadError, ModelSpec, model_from_config

DATA = Path(__file__).parents[1] / "data"
B = 10**9


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def spec(name: str) -> ModelSpec:
    return model_from_config(load(name), source=name)


@dataclass(frozen=True)
class Case:
    name: str
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context: int
    dtype: str
    tied: bool
    billions: float
    """The published total, in billions of parameters."""
    tolerance: float
    exact: int | None = None
    """The exact safetensors total where the model page gives it."""
    experts: int = 0
    per_token: int = 0
    moe_layers: int = 0
    active_billions: float | None = None


CASES = [
    Case(
        "ernie-4.5-0.3b-pt",
        "Ernie4_5ForCausalLM",
        18,
        1024,
        16,
        2,
        128,
        3072,
        103424,
        131072,
        "bfloat16",
        True,
        0.36,
        0.02,
    ),
    Case(
        "ernie-4.5-21b-a3b-pt",
        "Ernie4_5_MoeForCausalLM",
        28,
        2560,
        20,
        4,
        128,
        12288,
        103424,
        131072,
        "bfloat16",
        True,
        21.8,
        0.05,
        experts=64,
        per_token=6,
        moe_layers=27,
    ),
    Case(
        "qwen2.5-0.5b",
        "Qwen2ForCausalLM",
        24,
        896,
        14,
        2,
        64,
        4864,
        151936,
        32768,
        "bfloat16",
        True,
        0.49,
        0.03,
        exact=494_032_768,
    ),
    Case(
        "qwen3-30b-a3b",
        "Qwen3MoeForCausalLM",
        48,
        2048,
        32,
        4,
        128,
        6144,
        151936,
        40960,
        "bfloat16",
        False,
        30.5,
        0.03,
        exact=30_532_122_624,
        experts=128,
        per_token=8,
        moe_layers=48,
        active_billions=3.3,
    ),
    Case(
        "llama-3.1-8b",
        "LlamaForCausalLM",
        32,
        4096,
        32,
        8,
        128,
        14336,
        128256,
        131072,
        "bfloat16",
        False,
        8.03,
        0.03,
        exact=8_030_261_248,
    ),
    Case(
        "llama-3.1-70b",
        "LlamaForCausalLM",
        80,
        8192,
        64,
        8,
        128,
        28672,
        128256,
        131072,
        "bfloat16",
        False,
        70.6,
        0.03,
        exact=70_553_706_496,
    ),
    Case(
        "mistral-7b-v0.3",
        "MistralForCausalLM",
        32,
        4096,
        32,
        8,
        128,
        14336,
        32768,
        32768,
        "bfloat16",
        False,
        7.25,
        0.03,
        exact=7_248_023_552,
    ),
    Case(
        "gemma-2-2b",
        "Gemma2ForCausalLM",
        26,
        2304,
        8,
        4,
        256,
        9216,
        256000,
        8192,
        "float32",
        True,
        2.6,
        0.03,
        exact=2_614_341_888,
    ),
    Case(
        "phi-3-mini-4k",
        "Phi3ForCausalLM",
        32,
        3072,
        32,
        32,
        96,
        8192,
        32064,
        4096,
        "bfloat16",
        False,
        3.8,
        0.03,
        exact=3_821_079_552,
    ),
    Case(
        "mixtral-8x7b",
        "MixtralForCausalLM",
        32,
        4096,
        32,
        8,
        128,
        14336,
        32000,
        32768,
        "bfloat16",
        False,
        46.7,
        0.03,
        exact=46_702_792_704,
        experts=8,
        per_token=2,
        moe_layers=32,
        active_billions=12.9,
    ),
]
BY_NAME = {c.name: c for c in CASES}
IDS = [c.name for c in CASES]


def test_every_data_file_is_a_case_and_names_its_source() -> None:
    files = {p.stem for p in DATA.glob("*.json")}
    assert files == set(BY_NAME)
    for name in files:
        source = load(name)["_source"]
        assert source == "reconstructed" or (source.count("/") >= 2 and "." in source), (name, source)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fields_are_read(case: Case) -> None:
    m = spec(case.name)
    assert m.source == case.name
    assert m.architecture == case.architecture
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (case.layers, case.hidden, case.heads)
    assert (m.num_kv_heads, m.head_dim) == (case.kv_heads, case.head_dim)
    assert (m.intermediate_size, m.vocab_size, m.max_context) == (case.intermediate, case.vocab, case.context)
    assert (m.dtype, m.tie_word_embeddings) == (case.dtype, case.tied)
    assert (m.num_experts, m.experts_per_token, m.num_moe_layers) == (case.experts, case.per_token, case.moe_layers)
    assert m.is_moe == bool(case.experts)
    assert m.quantization is None and m.quant_bits is None


def test_ernie_small_reads_exactly() -> None:
    m = spec("ernie-4.5-0.3b-pt")
    assert m.model_type == "ernie4_5"
    assert m.num_layers == 18 and m.hidden_size == 1024 and m.intermediate_size == 3072
    assert m.num_attention_heads == 16 and m.num_kv_heads == 2 and m.head_dim == 128
    assert m.vocab_size == 103424 and m.max_context == 131072
    assert m.tie_word_embeddings is True and m.dtype == "bfloat16" and m.dtype_bytes == 2
    assert not m.is_moe and m.moe_intermediate_size is None


def test_moe_fields_per_family() -> None:
    ernie = spec("ernie-4.5-21b-a3b-pt")
    assert ernie.model_type == "ernie4_5_moe"
    assert ernie.moe_intermediate_size == 1536
    assert ernie.num_shared_experts == 2 and ernie.shared_expert_intermediate_size == 2 * 1536
    assert ernie.num_moe_layers == 27  # moe_layer_start_index 1: layer 0 keeps the dense MLP
    qwen = spec("qwen3-30b-a3b")
    assert qwen.moe_intermediate_size == 768 and qwen.num_shared_experts == 0
    mixtral = spec("mixtral-8x7b")
    assert mixtral.moe_intermediate_size == 14336  # experts are intermediate_size wide
    assert mixtral.num_shared_experts == 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_param_count_matches_published_total(case: Case) -> None:
    m = spec(case.name)
    assert m.param_count == pytest.approx(case.billions * B, rel=case.tolerance)
    if case.exact is not None:
        assert m.param_count == case.exact


@pytest.mark.parametrize("case", [c for c in CASES if c.active_billions], ids=lambda c: c.name)
def test_active_params_of_moe(case: Case) -> None:
    m = spec(case.name)
    assert case.active_billions is not None
    assert m.active_param_count == pytest.approx(case.active_billions * B, rel=0.03)


def test_ernie_moe_active_params() -> None:
    """The card's '3B activated' leaves out the (tied) embeddings; counting them gives 3.35 B."""
    m = spec("ernie-4.5-21b-a3b-pt")
    assert m.active_param_count - m.embedding_param_count == pytest.approx(3.0 * B, rel=0.05)
    assert 3.0 * B < m.active_param_count < 3.5 * B
    idle = 27 * (64 - 6) * 3 * 2560 * 1536
    assert m.param_count - m.active_param_count == idle


def test_dense_active_equals_total() -> None:
    m = spec("llama-3.1-8b")
    assert m.active_param_count == m.param_count


def vllm_kv_bytes(config: dict[str, Any], tp: int, pp: int) -> int:
    """vLLM's per-GPU KV bytes per token, straight from the raw config keys."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    width = 4 if config["torch_dtype"] == "float32" else 2
    layers = -(-config["num_hidden_layers"] // pp)
    return 2 * layers * max(1, kv_heads // tp) * head_dim * width


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 3), (16, 4)])
def test_kv_bytes_follow_vllm(case: Case, tp: int, pp: int) -> None:
    assert spec(case.name).kv_bytes_per_token(tp, pp) == vllm_kv_bytes(load(case.name), tp, pp)


def test_ernie_kv_bytes_per_gpu() -> None:
    """2 KV heads: TP 2 halves the per-GPU KV, past TP 2 each rank keeps a replicated head."""
    m = spec("ernie-4.5-0.3b-pt")
    assert m.kv_bytes_per_token() == 2 * 18 * 2 * 128 * 2 == 18432
    assert m.kv_bytes_per_token(tp=2) == 9216
    assert m.kv_bytes_per_token(tp=4) == 9216
    assert m.kv_bytes_per_token(tp=8) == 9216
    assert m.kv_bytes_per_token(pp=4) == 2 * 5 * 2 * 128 * 2  # ceil(18 / 4) layers on the largest stage
    assert m.kv_bytes_per_token(kv_dtype_bytes=1) == 9216  # fp8 KV cache


def test_kv_bytes_rejects_bad_parallelism() -> None:
    with pytest.raises(ValueError):
        spec("llama-3.1-8b").kv_bytes_per_token(tp=0)


def test_weight_bytes_by_dtype_and_quantization() -> None:
    llama = load("llama-3.1-8b")
    plain = model_from_config(llama, "x")
    assert plain.weight_bytes() == 8_030_261_248 * 2
    assert spec("gemma-2-2b").weight_bytes() == 2_614_341_888 * 4  # a float32 checkpoint
    emb = 2 * 128256 * 4096
    awq = model_from_config({**llama, "quantization_config": {"quant_method": "awq", "bits": 4}}, "x")
    assert (awq.quantization, awq.quant_bits) == ("awq", 4)
    assert awq.weight_bytes() == emb * 2 + (8_030_261_248 - emb) // 2
    fp8 = model_from_config({**llama, "quantization_config": {"quant_method": "fp8"}}, "x")
    assert fp8.quant_bits == 8 and fp8.weight_bytes() == emb * 2 + (8_030_261_248 - emb)
    bnb = model_from_config(
        {**llama, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}, "x"
    )
    assert bnb.quant_bits == 4
    gptq8 = model_from_config({**llama, "quantization_config": {"quant_method": "gptq", "bits": 8}}, "x")
    assert gptq8.weight_bytes() == fp8.weight_bytes()


@pytest.mark.parametrize(
    ("raw", "dtype"),
    [
        ("bfloat16", "bfloat16"),
        ("bf16", "bfloat16"),
        ("torch.float16", "float16"),
        ("half", "float16"),
        ("float32", "float32"),
        ("fp32", "float32"),
        (None, "float32"),
    ],
)
def test_dtype_is_normalised(raw: str | None, dtype: str) -> None:
    config = {k: v for k, v in load("qwen2.5-0.5b").items() if k != "torch_dtype"}
    if raw is not None:
        config["dtype"] = raw  # transformers 5 writes "dtype"
    assert model_from_config(config, "x").dtype == dtype


def test_unknown_dtype_is_a_clear_error() -> None:
    with pytest.raises(ModelReadError, match=r"model 'x': config.json has dtype 'int8'"):
        model_from_config({**load("qwen2.5-0.5b"), "torch_dtype": "int8"}, "x")


def test_context_aliases_and_rope_scaling() -> None:
    base = {k: v for k, v in load("qwen2.5-0.5b").items() if k != "max_position_embeddings"}
    assert model_from_config({**base, "seq_length": 8192}, "x").max_context == 8192
    assert model_from_config({**base, "n_positions": 2048}, "x").max_context == 2048
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    scaled = model_from_config({**base, "max_position_embeddings": 32768, "rope_scaling": yarn}, "x")
    assert scaled.max_context == 131072
    assert spec("llama-3.1-8b").max_context == 131072  # llama3 rope scaling is already included


def test_multimodal_text_config_supplies_the_lm() -> None:
    text = {k: v for k, v in load("qwen2.5-0.5b").items() if k not in ("architectures", "torch_dtype", "_source")}
    config = {
        "architectures": ["SomeVLForConditionalGeneration"],
        "model_type": "some_vl",
        "torch_dtype": "bfloat16",
        "text_config": text,
        "vision_config": {"hidden_size": 1152},
    }
    m = model_from_config(config, "org/vl")
    assert m.architecture == "SomeVLForConditionalGeneration"
    assert (m.num_attention_heads, m.num_kv_heads, m.hidden_size) == (14, 2, 896)
    assert m.param_count == 494_032_768  # the language model alone


def test_unknown_architecture_with_standard_keys_parses() -> None:
    config = {**load("llama-3.1-8b"), "architectures": ["BrandNewForCausalLM"], "model_type": "brand_new"}
    m = model_from_config(config, "x")
    assert m.architecture == "BrandNewForCausalLM"
    assert m.param_count == 8_030_261_248


def test_errors_without_a_path_name_config_json() -> None:
    with pytest.raises(ModelReadError, match=r"^model 'x': config.json has 'num_attention_heads': 0; it must be"):
        model_from_config({**load("llama-3.1-8b"), "num_attention_heads": 0}, "x")
    with pytest.raises(ModelReadError, match=r"^model 'x': /m/config.json has 'architectures': \['BertModel'\]"):
        model_from_config({**load("llama-3.1-8b"), "architectures": ["BertModel"]}, "x", path="/m/config.json")


def test_qwen2_moe_shared_expert_and_sparse_layers() -> None:
    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "torch_dtype": "bfloat16",
        "num_hidden_layers": 8,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 256,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 128,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    m = model_from_config(config, "x")
    assert m.num_moe_layers == 3  # layers 1, 5, 7: odd, and not the dense-only layer 3
    assert m.num_shared_experts == 1 and m.shared_expert_intermediate_size == 128
    assert m.attention_bias  # Qwen2 family has q/k/v biases without saying so
    attention = 2 * 64 * 64 + 2 * 64 * 32 + (64 + 2 * 32)
    moe = 64 * 4 + 4 * 3 * 64 * 32 + 3 * 64 * 128
    expected = 1000 * 64 * 2 + 8 * (attention + 2 * 64) + 5 * 3 * 64 * 256 + 3 * moe + 64
    assert m.param_count == expected
    assert m.active_param_count == expected - 3 * 2 * 3 * 64 * 32


def test_hand_built_spec_fills_param_count_and_keeps_a_given_one() -> None:
    fields: dict[str, Any] = {
        "source": "x",
        "architecture": "",
        "model_type": "llama",
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_context": 8192,
        "dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    assert ModelSpec(**fields).param_count == 8_030_261_248
    with pytest.raises(ValueError, match="num_attention_heads=32 is not a multiple of num_kv_heads=12"):
        ModelSpec(**{**fields, "num_kv_heads": 12})
    assert ModelSpec(**fields, param_count=123).param_count == 123
    with pytest.raises(ValueError):
        ModelSpec(**fields).num_layers = 1
