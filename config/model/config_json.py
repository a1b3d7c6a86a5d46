"""A parsed config.json -> ModelSpec: the key names of each model family, MoE layouts, dtype, context, quantization.

Pure: no files, no network (``config.model.reading`` finds and reads the file).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from config.errors import ModelReadError
from config.model.spec import UNGATED_MLP_TYPES, Dtype, ModelSpec

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
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
_EXPERT_KEYS = ("moe_num_experts", "num_experts", "num_local_experts", "n_routed_experts")
_TOP_K_KEYS = ("moe_k", "num_experts_per_tok", "experts_per_token", "moe_topk")

# Architectures known not to write text, refused: heads for classification, tagging, answers
# spans or masked tokens, and the families of encoders, speech and encoder-decoder models. Any
# other name is served (vLLM says at start if it does not know it): chat models' class names
# vary too much to list (…ForCausalLM, …LMHeadModel, …ForConditionalGeneration, InternVLChatModel,
# ChatGLMModel, MiniCPMV, NVLM_D, Ovis).
_NOT_CHAT_SUFFIXES = (
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMaskedLM",
    "ForMultipleChoice",
    "ForImageClassification",
    "ForAudioClassification",
    "ForCTC",
    "ForPreTraining",
    "ForNextSentencePrediction",
)
_NOT_CHAT_FAMILIES = frozenset(
    {"Bert", "Roberta", "XLMRoberta", "DistilBert", "Electra", "Deberta", "DebertaV2", "Albert", "MPNet"}
    | {"NomicBert", "ModernBert", "CLIP", "Siglip", "Wav2Vec2", "Hubert", "ViT"}
    | {"Whisper", "Speech2Text", "SeamlessM4T", "SeamlessM4Tv2", "T5", "MT5", "UMT5", "LongT5", "Bart", "MBart"}
    | {"Pegasus", "PegasusX", "Florence2"}
)
_FAMILY_ENDINGS = ("ForConditionalGeneration", "EncoderModel", "Model")
_GENERATING = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
"""Where a config lists several classes, one of these is the served one (``LlamaModel`` is the bare base)."""

_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "seq_length",
    "n_positions",
    "max_seq_len",
    "seq_len",
)


def model_from_config(config: Mapping[str, Any], source: str, path: str | Path | None = None) -> ModelSpec:
    """The shape in a parsed config.json (pure: no files, no network).

    ``path``: the file it was read from, named in error messages (else "config.json").
    Multimodal configs keep the language model under ``text_config``; its keys win over the
    top level for the LM fields, while architectures, dtype and quantization may sit on top.

    Refused, with a one-line ModelReadError naming the file and the key: an architecture
    that is not a chat model (see ``_is_chat_architecture``; a config without
    ``architectures`` is read as it is), a count below 1 (layers, hidden size, heads, KV
    heads, head_dim, intermediate size, vocab, context), attention heads that are not a
    multiple of the KV heads, and an MoE top-k outside 1..experts.
    """
    where = f"model '{source}': {path or 'config.json'}"
    top = dict(config)
    text = top.get("text_config")
    cfg: dict[str, Any] = {**top, **text} if isinstance(text, Mapping) else top
    cfg = {k: v for k, v in cfg.items() if v is not None}
    architecture = _architecture(top.get("architectures") or cfg.get("architectures"), where)

    def need(key: str) -> tuple[str, int]:
        found = _first_count(cfg, _ALIASES.get(key, (key,)), where)
        if found is None:
            raise ModelReadError(f"{where} lacks '{key}'")
        return found

    num_layers = need("num_hidden_layers")[1]
    hidden = need("hidden_size")[1]
    heads_key, heads = need("num_attention_heads")
    vocab = need("vocab_size")[1]
    try:
        intermediate = need("intermediate_size")[1]
    except ModelReadError:
        if cfg.get("model_type") not in UNGATED_MLP_TYPES or any(k in cfg for k in _ALIASES["intermediate_size"]):
            raise
        intermediate = 4 * hidden  # GPT-2 style: n_inner null means 4 x hidden
    kv = _first_count(cfg, _KV_HEAD_KEYS, where)
    kv_key, kv_heads = kv if kv is not None else ("num_key_value_heads", 1 if cfg.get("multi_query") else heads)
    if kv_heads > heads:
        raise ModelReadError(
            f"{where} has '{kv_key}': {kv_heads}, more than '{heads_key}': {heads}; "
            "each KV head serves a whole group of attention heads"
        )
    if heads % kv_heads:
        raise ModelReadError(
            f"{where} has '{heads_key}': {heads}, not a multiple of '{kv_key}': {kv_heads}; "
            "each KV head must serve the same number of attention heads"
        )
    given_head_dim = _first_count(cfg, ("head_dim",), where)
    head_dim = given_head_dim[1] if given_head_dim else hidden // heads

    model_type = str(top.get("model_type") or cfg.get("model_type") or "")
    text_type = str(cfg.get("model_type") or model_type)
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        tied = text_type in _TIED_BY_DEFAULT or model_type in _TIED_BY_DEFAULT
    moe = _moe_fields(cfg, num_layers, intermediate, where)
    method, bits = _quantization(top.get("quantization_config") or cfg.get("quantization_config"))
    bias = bool(cfg.get("attention_bias") or cfg.get("use_bias") or text_type in _QKV_BIAS_TYPES)

    try:
        return ModelSpec(
            source=source,
            architecture=architecture,
            model_type=model_type,
            num_layers=num_layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=vocab,
            max_context=_max_context(cfg, text_type, where),
            dtype=_dtype(top, cfg, where),
            tie_word_embeddings=bool(tied),
            attention_bias=bias,
            quantization=method,
            quant_bits=bits,
            **moe,
        )
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in err.errors())
        raise ModelReadError(f"{where} is inconsistent: {problems}") from None


def _is_chat_architecture(name: str) -> bool:
    """Whether ``name`` may be a chat (text-writing) model: anything but a non-generating head
    (``...ForSequenceClassification``, ``...ForMaskedLM``, ...) or a class of an encoder, speech or
    encoder-decoder family (``BertModel``, ``WhisperForConditionalGeneration``, ``T5EncoderModel``)."""
    families = {name.removesuffix(ending) for ending in _FAMILY_ENDINGS if name.endswith(ending)}
    return not name.endswith(_NOT_CHAT_SUFFIXES) and not families & _NOT_CHAT_FAMILIES


def _architecture(raw: Any, where: str) -> str:
    """The served class of ``architectures``: the first chat one; a single string is that one class.

    No ``architectures`` (or an empty one) gives "" and is not checked.
    """
    if raw is None or (isinstance(raw, (str, list)) and not raw):
        return ""
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ModelReadError(
            f"{where} has 'architectures': {raw!r}; expected a list of model class names such as [\"LlamaForCausalLM\"]"
        )
    chat = sorted((n for n in names if _is_chat_architecture(n)), key=lambda n: not n.endswith(_GENERATING))
    if not chat:
        raise ModelReadError(
            f"{where} has 'architectures': {names}, not a causal language model; this project serves chat models "
            "(such as ...ForCausalLM or ...ForConditionalGeneration of a vision-language model), not encoders, "
            "classifiers, Whisper, T5 or BART"
        )
    return chat[0]


def _int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ModelReadError(f"{where} has '{key}': {value!r}, not an integer")
    return int(value)


def _first_key_int(cfg: Mapping[str, Any], keys: tuple[str, ...], where: str) -> tuple[str, int] | None:
    """(key, value) of the first of ``keys`` that config.json sets; None when it sets none."""
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, list):  # ERNIE-VL lists text and vision values; the text one comes first
            value = value[0] if value else None
        if value is not None:
            return key, _int(value, key, where)
    return None


def _first_int(cfg: Mapping[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    found = _first_key_int(cfg, keys, where)
    return found[1] if found else None


def _first_count(cfg: Mapping[str, Any], keys: tuple[str, ...], where: str) -> tuple[str, int] | None:
    """Like ``_first_key_int`` for a count that must be at least 1 when given."""
    found = _first_key_int(cfg, keys, where)
    if found is not None and found[1] < 1:
        raise ModelReadError(f"{where} has '{found[0]}': {found[1]}; it must be at least 1")
    return found


def _moe_fields(cfg: Mapping[str, Any], num_layers: int, intermediate: int, where: str) -> dict[str, Any]:
    """Experts and which layers use them, under each family's key names.

    ERNIE: moe_num_experts / moe_k / moe_num_shared_experts, MoE on layers i with
    start <= i <= end and (i + 1) % interval == 0. Qwen-MoE: num_experts /
    num_experts_per_tok, MoE where (i + 1) % decoder_sparse_step == 0 and i not in
    mlp_only_layers. Mixtral: num_local_experts on every layer. DeepSeek-style:
    n_routed_experts, dense below first_k_dense_replace. With experts, the top-k (when
    given) must be 1..experts; a config without one keeps 0.
    """
    found = _first_key_int(cfg, _EXPERT_KEYS, where)
    if found is not None and found[1] < 0:
        raise ModelReadError(f"{where} has '{found[0]}': {found[1]}; it must be 0 (a dense model) or more")
    if not found or not found[1]:
        return {}
    experts_key, experts = found
    top_k = _first_key_int(cfg, _TOP_K_KEYS, where)
    if top_k is not None and not 1 <= top_k[1] <= experts:
        raise ModelReadError(
            f"{where} has '{top_k[0]}': {top_k[1]}; each token goes to 1 to {experts} experts ('{experts_key}')"
        )
    k = top_k[1] if top_k else 0
    width = _first_count(cfg, ("moe_intermediate_size",), where)
    expert_width = width[1] if width else intermediate
    shared = _first_int(cfg, ("moe_num_shared_experts", "n_shared_experts"), where) or 0
    shared_width = shared * expert_width
    qwen_shared = _first_int(cfg, ("shared_expert_intermediate_size",), where) or 0
    if qwen_shared:
        shared, shared_width = max(shared, 1), qwen_shared

    if "moe_layer_start_index" in cfg or "moe_layer_interval" in cfg or "moe_num_experts" in cfg:
        start = _first_int(cfg, ("moe_layer_start_index",), where) or 0
        end = _first_int(cfg, ("moe_layer_end_index",), where)
        end = num_layers - 1 if end is None or end < 0 else end
        step = _first_int(cfg, ("moe_layer_interval",), where) or 1
        moe_layers = [i for i in range(num_layers) if start <= i <= end and (i + 1) % step == 0]
    elif isinstance(cfg.get("moe_layers"), list):
        moe_layers = [i for i in cfg["moe_layers"] if isinstance(i, int) and 0 <= i < num_layers]
    elif "first_k_dense_replace" in cfg or "n_routed_experts" in cfg:
        first = _first_int(cfg, ("first_k_dense_replace",), where) or 0
        freq = _first_int(cfg, ("moe_layer_freq",), where) or 1
        moe_layers = [i for i in range(first, num_layers) if i % freq == 0]
    else:
        step = _first_int(cfg, ("decoder_sparse_step", "interleave_moe_layer_step"), where) or 1
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


def _dtype(top: Mapping[str, Any], cfg: Mapping[str, Any], where: str) -> Dtype:
    """torch_dtype or dtype (transformers 5 renamed it); float32 when absent, as transformers assumes."""
    raw = None
    for level in (cfg, top):
        raw = level.get("torch_dtype") or level.get("dtype")
        if raw:
            break
    if not raw:
        return "float32"
    name = str(raw).lower().removeprefix("torch.")
    if name not in _DTYPE_ALIASES:
        raise ModelReadError(f"{where} has dtype {raw!r}; expected bfloat16, float16 or float32")
    return _DTYPE_ALIASES[name]


def _max_context(cfg: Mapping[str, Any], model_type: str, where: str) -> int:
    """The trained context (smallest of the length keys), stretched by RoPE scaling as vLLM does."""
    lengths = [(_int(cfg[k], k, where), k) for k in _CONTEXT_KEYS if isinstance(cfg.get(k), (int, float))]
    if not lengths:
        raise ModelReadError(f"{where} lacks 'max_position_embeddings'")
    context, key = min(lengths)
    if context < 1:
        raise ModelReadError(f"{where} has '{key}': {context}; it must be at least 1")
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
