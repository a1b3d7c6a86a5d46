"""A parsed config.json -> ModelSpec: the key names of each model family, MoE layouts, dtype, context, quantization.

Pure: no files, no network (``config.model.reading`` finds and reads the file).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from config.errors import ModelReadError
from config.model.params import UNGATED_MLP_TYPES
from config.model.spec import Dtype, ModelSpec

_DTYPE_ALIASES: dict[str, Dtype] = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}

# Model types whose config class defaults tie_word_embeddings to True (most default to False);
# only consulted when config.json does not say.
_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "ernie4_5", "ernie4_5_moe", "gpt2", "opt"})
# Model types with q/k/v biases even though config.json has no attention_bias key.
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text"})
# RoPE scaling types that stretch the trained context, as vLLM's derived max_model_len applies.
_STRETCHING_ROPE = frozenset({"linear", "dynamic", "yarn"})

# Bits per weight of the linear layers for quantization methods that do not say "bits".
_QUANT_DEFAULT_BITS: dict[str, int] = {
    "awq": 4,
    "awq_marlin": 4,
    "gptq": 4,
    "gptq_marlin": 4,
    "marlin": 4,
    "mxfp4": 4,
    "fp8": 8,
    "fbgemm_fp8": 8,
    "experts_int8": 8,
}

_ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner"),
}
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "seq_length",
    "n_positions",
    "max_seq_len",
    "seq_len",
)


def model_from_config(config: Mapping[str, Any], source: str) -> ModelSpec:
    """The shape in a parsed config.json (pure: no files, no network).

    Multimodal configs keep the language model under ``text_config``; its keys win over the
    top level for the LM fields, while architectures, dtype and quantization may sit on top.
    """
    top = dict(config)
    text = top.get("text_config")
    cfg: dict[str, Any] = {**top, **text} if isinstance(text, Mapping) else top
    cfg = {k: v for k, v in cfg.items() if v is not None}

    def need(key: str) -> int:
        for name in _ALIASES.get(key, (key,)):
            value = cfg.get(name)
            if value is not None:
                return _int(value, name, source)
        raise ModelReadError(f"model '{source}': config.json lacks '{key}'")

    num_layers = need("num_hidden_layers")
    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    vocab = need("vocab_size")
    try:
        intermediate = need("intermediate_size")
    except ModelReadError:
        if cfg.get("model_type") not in UNGATED_MLP_TYPES:
            raise
        intermediate = 4 * hidden  # GPT-2 style: n_inner null means 4 x hidden
    kv_heads = _first_int(cfg, ("num_key_value_heads", "num_kv_heads", "n_head_kv"), source)
    if kv_heads is None:
        kv_heads = 1 if cfg.get("multi_query") else heads
    head_dim = _first_int(cfg, ("head_dim",), source) or hidden // heads

    architectures = top.get("architectures") or cfg.get("architectures") or []
    model_type = str(top.get("model_type") or cfg.get("model_type") or "")
    text_type = str(cfg.get("model_type") or model_type)
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        tied = text_type in _TIED_BY_DEFAULT or model_type in _TIED_BY_DEFAULT
    moe = _moe_fields(cfg, num_layers, intermediate, source)
    method, bits = _quantization(top.get("quantization_config") or cfg.get("quantization_config"))
    bias = bool(cfg.get("attention_bias") or cfg.get("use_bias") or text_type in _QKV_BIAS_TYPES)

    try:
        return ModelSpec(
            source=source,
            architecture=str(architectures[0]) if architectures else "",
            model_type=model_type,
            num_layers=num_layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=vocab,
            max_context=_max_context(cfg, text_type, source),
            dtype=_dtype(top, cfg, source),
            tie_word_embeddings=bool(tied),
            attention_bias=bias,
            quantization=method,
            quant_bits=bits,
            **moe,
        )
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in err.errors())
        raise ModelReadError(f"model '{source}': config.json is inconsistent: {problems}") from None


def _int(value: Any, key: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ModelReadError(f"model '{source}': config.json has '{key}': {value!r}, not an integer")
    return int(value)


def _first_int(cfg: Mapping[str, Any], keys: tuple[str, ...], source: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, list):  # ERNIE-VL lists text and vision values; the text one comes first
            value = value[0] if value else None
        if value is not None:
            return _int(value, key, source)
    return None


def _moe_fields(cfg: Mapping[str, Any], num_layers: int, intermediate: int, source: str) -> dict[str, Any]:
    """Experts and which layers use them, under each family's key names.

    ERNIE: moe_num_experts / moe_k / moe_num_shared_experts, MoE on layers i with
    start <= i <= end and (i + 1) % interval == 0. Qwen-MoE: num_experts /
    num_experts_per_tok, MoE where (i + 1) % decoder_sparse_step == 0 and i not in
    mlp_only_layers. Mixtral: num_local_experts on every layer. DeepSeek-style:
    n_routed_experts, dense below first_k_dense_replace.
    """
    experts = _first_int(cfg, ("moe_num_experts", "num_experts", "num_local_experts", "n_routed_experts"), source)
    if not experts:
        return {}
    k = _first_int(cfg, ("moe_k", "num_experts_per_tok", "experts_per_token", "moe_topk"), source) or 0
    expert_width = _first_int(cfg, ("moe_intermediate_size",), source) or intermediate
    shared = _first_int(cfg, ("moe_num_shared_experts", "n_shared_experts"), source) or 0
    shared_width = shared * expert_width
    qwen_shared = _first_int(cfg, ("shared_expert_intermediate_size",), source) or 0
    if qwen_shared:
        shared, shared_width = max(shared, 1), qwen_shared

    if "moe_layer_start_index" in cfg or "moe_layer_interval" in cfg or "moe_num_experts" in cfg:
        start = _first_int(cfg, ("moe_layer_start_index",), source) or 0
        end = _first_int(cfg, ("moe_layer_end_index",), source)
        end = num_layers - 1 if end is None or end < 0 else end
        step = _first_int(cfg, ("moe_layer_interval",), source) or 1
        moe_layers = [i for i in range(num_layers) if start <= i <= end and (i + 1) % step == 0]
    elif isinstance(cfg.get("moe_layers"), list):
        moe_layers = [i for i in cfg["moe_layers"] if isinstance(i, int) and 0 <= i < num_layers]
    elif "first_k_dense_replace" in cfg or "n_routed_experts" in cfg:
        first = _first_int(cfg, ("first_k_dense_replace",), source) or 0
        freq = _first_int(cfg, ("moe_layer_freq",), source) or 1
        moe_layers = [i for i in range(first, num_layers) if i % freq == 0]
    else:
        step = _first_int(cfg, ("decoder_sparse_step", "interleave_moe_layer_step"), source) or 1
        dense_only = {i for i in cfg.get("mlp_only_layers") or [] if isinstance(i, int)}
        moe_layers = [i for i in range(num_layers) if (i + 1) % step == 0 and i not in dense_only]
    return {
        "num_experts": experts,
        "experts_per_token": k,
        "moe_intermediate_size": expert_width,
        "num_shared_experts": shared,
        "shared_expert_intermediate_size": shared_width,
        "num_moe_layers": len(moe_layers),
    }


def _dtype(top: Mapping[str, Any], cfg: Mapping[str, Any], source: str) -> Dtype:
    """torch_dtype or dtype (transformers 5 renamed it); float32 when absent, as transformers assumes."""
    raw = None
    for where in (cfg, top):
        raw = where.get("torch_dtype") or where.get("dtype")
        if raw:
            break
    if not raw:
        return "float32"
    name = str(raw).lower().removeprefix("torch.")
    if name not in _DTYPE_ALIASES:
        raise ModelReadError(f"model '{source}': config.json has dtype {raw!r}; expected bfloat16, float16 or float32")
    return _DTYPE_ALIASES[name]


def _max_context(cfg: Mapping[str, Any], model_type: str, source: str) -> int:
    """The trained context (smallest of the length keys), stretched by RoPE scaling as vLLM does."""
    lengths = [_int(cfg[k], k, source) for k in _CONTEXT_KEYS if isinstance(cfg.get(k), (int, float))]
    if not lengths:
        raise ModelReadError(f"model '{source}': config.json lacks 'max_position_embeddings'")
    context = min(lengths)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, Mapping) and not model_type.startswith("gemma3"):
        kind = rope.get("rope_type") or rope.get("type")
        factor = rope.get("factor")
        if kind in _STRETCHING_ROPE and isinstance(factor, (int, float)) and factor > 1:
            base = rope.get("original_max_position_embeddings") if kind == "yarn" else None
            context = int((base if isinstance(base, int) else context) * factor)
    return context


def _quantization(qc: Any) -> tuple[str | None, int | None]:
    """(quant_method, bits of the quantized linear weights); (None, None) when unquantized."""
    if not isinstance(qc, Mapping):
        return None, None
    method = str(qc.get("quant_method") or qc.get("quant_algo") or "").lower() or None
    if method is None:
        return None, None
    bits = qc.get("bits") or qc.get("weight_bits") or qc.get("w_bit")
    if method == "bitsandbytes":
        bits = 4 if qc.get("load_in_4bit") else 8
    elif method == "compressed-tensors":
        bits = _compressed_tensors_bits(qc)
    elif method in ("modelopt", "nvfp4", "fp4"):
        algo = str(qc.get("quant_algo") or method).lower()
        bits = 4 if "fp4" in algo or "int4" in algo else 8
    if not isinstance(bits, int):
        bits = _QUANT_DEFAULT_BITS.get(method, 4 if "4" in method else 8)
    return method, bits


def _compressed_tensors_bits(qc: Mapping[str, Any]) -> int | None:
    groups = qc.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and isinstance(weights.get("num_bits"), int):
                return int(weights["num_bits"])
    return None
