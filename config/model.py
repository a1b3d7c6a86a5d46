"""What the planner needs to know about a model, read from its ``config.json`` alone.

Planning must work before any weights are downloaded, so everything here (layer count,
heads, experts, dtype, parameter count, KV bytes per token) is derived from the shape in
``config.json``: a local directory, a path to the file, or a Hugging Face id read through
the local cache (``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``).

The numbers are estimates with documented simplifications (see ``param_count`` and
``kv_bytes_per_token``); they are good to a few percent, which is what sizing TP/PP needs.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from config.errors import ModelReadError

Dtype = Literal["bfloat16", "float16", "float32"]

_DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
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
# Model types whose MLP is up/down only (two matrices), not gated (three).
_UNGATED_MLP_TYPES = frozenset(
    {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "falcon", "phi", "opt", "bloom", "starcoder2"}
)
# Model types with four norms per layer (pre/post attention and pre/post MLP) instead of two.
_FOUR_NORM_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text"})
# Model types with per-head RMS norms on q and k (head_dim weights each, per layer).
_QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text"})
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


class ModelSpec(BaseModel):
    """A model's shape as the planner uses it: sizes, experts, dtype and derived byte counts."""

    model_config = ConfigDict(frozen=True)

    source: str
    """The Hugging Face id or local path it was read from."""
    architecture: str
    """``architectures[0]``; empty when config.json does not list one."""
    model_type: str
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    """``num_key_value_heads``; equal to the attention heads for plain multi-head attention."""
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    """The dense MLP width (for Mixtral-style MoE, where every layer is MoE, the expert width)."""
    vocab_size: int = Field(ge=1)
    max_context: int = Field(ge=1)
    """Longest sequence: max_position_embeddings (or its aliases), stretched by linear/dynamic/yarn
    RoPE scaling as vLLM derives max_model_len."""
    dtype: Dtype
    """The checkpoint dtype (torch_dtype / dtype; float32 when absent, as in transformers)."""
    tie_word_embeddings: bool
    num_experts: int = Field(default=0, ge=0)
    """Routed experts per MoE layer; 0 for a dense model."""
    experts_per_token: int = Field(default=0, ge=0)
    moe_intermediate_size: int | None = None
    """Width of one routed expert's MLP."""
    num_shared_experts: int = Field(default=0, ge=0)
    shared_expert_intermediate_size: int = Field(default=0, ge=0)
    """Total MLP width of the always-active shared experts of one MoE layer (ERNIE:
    num_shared x moe_intermediate_size; Qwen2-MoE: shared_expert_intermediate_size)."""
    num_moe_layers: int = Field(default=0, ge=0)
    """How many layers route through experts; the rest use the dense MLP."""
    attention_bias: bool = False
    """q/k/v projections carry biases (Qwen2, ``attention_bias`` / ``use_bias``)."""
    quantization: str | None = None
    """``quantization_config.quant_method`` (awq, gptq, bitsandbytes, fp8, ...)."""
    quant_bits: int | None = None
    """Bits per weight of the quantized linear layers; None when unquantized."""
    param_count: int = Field(default=0, ge=0)
    """Total parameters of the language model, computed from the shape when not given."""

    @model_validator(mode="after")
    def _derive(self) -> ModelSpec:
        """Fill param_count from the shape, so a hand-built spec is consistent by default."""
        if self.num_experts and self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}")
        if self.num_moe_layers > self.num_layers:
            raise ValueError(f"num_moe_layers={self.num_moe_layers} exceeds num_layers={self.num_layers}")
        if "param_count" not in self.model_fields_set:
            self.__dict__["param_count"] = _count_params(self)
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.num_moe_layers > 0

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.dtype]

    @property
    def embedding_param_count(self) -> int:
        """Input embeddings plus the LM head when it is not tied (never quantized by AWQ/GPTQ)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def expert_param_count(self) -> int:
        """Parameters of one routed expert (a gated MLP of ``moe_intermediate_size``)."""
        return 3 * self.hidden_size * (self.moe_intermediate_size or self.intermediate_size)

    @property
    def active_param_count(self) -> int:
        """Parameters each token runs through: all but the routed experts it is not sent to."""
        if not self.is_moe:
            return self.param_count
        idle = self.num_moe_layers * (self.num_experts - self.experts_per_token)
        return self.param_count - idle * self.expert_param_count

    def weight_bytes(self) -> int:
        """Bytes of the checkpoint's weights in its own dtype (float32 checkpoints: 4 B/param).

        Quantized checkpoints: every non-embedding parameter at ``quant_bits / 8`` bytes
        (4-bit AWQ/GPTQ/bnb: 0.5, fp8: 1), embeddings and LM head at ``dtype``. Group scales
        and zero points (about +3 % at group size 128) and the few unquantized norms, biases
        and routers are ignored.
        """
        if self.quant_bits is None:
            return self.param_count * self.dtype_bytes
        emb = self.embedding_param_count
        body = max(self.param_count - emb, 0)
        return emb * self.dtype_bytes + math.ceil(body * self.quant_bits / 8)

    def kv_bytes_per_token(self, tp: int = 1, pp: int = 1, kv_dtype_bytes: int | None = None) -> int:
        """KV-cache bytes one token takes on one GPU, by vLLM's formula.

        ``2 (K and V) x ceil(num_layers / pp) x kv_heads_per_rank x head_dim x bytes`` with
        ``kv_heads_per_rank = max(1, num_kv_heads // tp)``: KV heads are split across TP ranks
        only down to one head per rank; past ``tp == num_kv_heads`` every rank keeps a
        replicated head, so more TP buys no more KV room per GPU. ``kv_dtype_bytes`` defaults
        to the model dtype (vLLM's ``kv_cache_dtype=auto``). Every layer is counted as full
        attention: sliding-window layers (Gemma-2, Mistral v0.1) make this an upper bound,
        and MLA models (DeepSeek) are not modelled.
        """
        if tp < 1 or pp < 1:
            raise ValueError(f"tp and pp must be >= 1, got tp={tp} pp={pp}")
        layers = math.ceil(self.num_layers / pp)
        heads = max(1, self.num_kv_heads // tp)
        width = kv_dtype_bytes if kv_dtype_bytes is not None else self.dtype_bytes
        return 2 * layers * heads * self.head_dim * width


def _count_params(spec: ModelSpec) -> int:
    """Parameters from the shape: embeddings, attention, norms, dense and MoE MLPs.

    Per layer: q (hidden x heads x head_dim), k and v (hidden x kv_heads x head_dim each),
    o (heads x head_dim x hidden), q/k/v biases when present, 2 RMS norms (4 for Gemma-2/3)
    and per-head q/k norms (Qwen3, Gemma-3). MLP: 3 x hidden x intermediate when gated (2
    when not); an MoE layer has a router (hidden x experts), the routed experts and the
    shared experts instead. Then one final norm. This reproduces the published safetensors
    totals of Llama-3.1, Mistral, Mixtral, Qwen2.5/3, Gemma-2 and Phi-3 exactly; vision
    towers, MTP heads and Qwen2-MoE's one-unit shared-expert gate are left out.
    """
    h, hd = spec.hidden_size, spec.head_dim
    q_width, kv_width = spec.num_attention_heads * hd, spec.num_kv_heads * hd
    attention = 2 * h * q_width + 2 * h * kv_width
    if spec.attention_bias:
        attention += q_width + 2 * kv_width
    norms = (4 if spec.model_type in _FOUR_NORM_TYPES else 2) * h
    if spec.model_type in _QK_NORM_TYPES:
        norms += 2 * hd
    dense_mlp = (2 if spec.model_type in _UNGATED_MLP_TYPES else 3) * h * spec.intermediate_size
    moe_layers = spec.num_moe_layers if spec.num_experts else 0
    moe_mlp = (
        h * spec.num_experts + spec.num_experts * spec.expert_param_count + 3 * h * spec.shared_expert_intermediate_size
    )
    layers = spec.num_layers * (attention + norms)
    layers += (spec.num_layers - moe_layers) * dense_mlp + moe_layers * moe_mlp
    return spec.embedding_param_count + layers + h


# --------------------------------------------------------------------------- parsing


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
        if cfg.get("model_type") not in _UNGATED_MLP_TYPES:
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


# --------------------------------------------------------------------------- reading


def read_model(source: str | Path, *, revision: str | None = None) -> ModelSpec:
    """The shape of a local model directory, a config.json path, or a Hugging Face id."""
    name = str(source)
    path = Path(name).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelReadError(f"model '{name}': no config.json in {path}")
        return model_from_config(_load_json(config_path, name), source=name)
    if path.is_file():
        return model_from_config(_load_json(path, name), source=name)
    if _looks_local(name):
        raise ModelReadError(f"model '{name}': no such directory or file {path}")
    return model_from_config(_load_json(_hub_config(name, revision), name), source=name)


def _looks_local(name: str) -> bool:
    """A path the user meant as local: absolute, ./ ../ ~, or deeper than org/name."""
    return name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1 or name.endswith("config.json")


def _load_json(path: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ModelReadError(f"model '{name}': cannot read {path}: {err}") from None
    except json.JSONDecodeError as err:
        raise ModelReadError(f"model '{name}': {path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ModelReadError(f"model '{name}': {path} is not a JSON object")
    return data


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _hub_cache_dir() -> Path:
    """HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub, read at call time.

    huggingface_hub reads these once at import; reading them per call keeps a changed
    environment (tests, a settings reload) honoured.
    """
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


@lru_cache(maxsize=1)
def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the hub answers at all: huggingface_hub retries ~24 s before giving up."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname or "", url.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _hub_config(repo_id: str, revision: str | None) -> Path:
    """config.json of a hub model via the local cache; the hub only when not offline."""
    from huggingface_hub import errors as hub
    from huggingface_hub import hf_hub_download  # lazy: only hub ids need it

    offline = _env_flag("HF_HUB_OFFLINE") or not hub_reachable()
    where = f"model '{repo_id}'" + (f" (revision {revision})" if revision else "")
    try:
        path = hf_hub_download(
            repo_id,
            "config.json",
            revision=revision,
            cache_dir=_hub_cache_dir(),
            local_files_only=offline,
        )
    except hub.HFValidationError:
        raise ModelReadError(f"model '{repo_id}': not a local directory and not a valid Hugging Face id") from None
    except hub.LocalEntryNotFoundError:
        reason = "offline: HF_HUB_OFFLINE is set" if offline else "offline"
        raise ModelReadError(
            f"{where}: not in the local Hugging Face cache and the hub cannot be reached ({reason})"
        ) from None
    except hub.GatedRepoError:
        raise ModelReadError(f"{where}: gated on the hub; accept its license and set HF_TOKEN") from None
    except hub.RevisionNotFoundError:
        raise ModelReadError(f"{where}: no such revision on the Hugging Face hub") from None
    except hub.RepositoryNotFoundError:
        raise ModelReadError(f"{where}: no such model on the Hugging Face hub (private? set HF_TOKEN)") from None
    except hub.EntryNotFoundError:
        raise ModelReadError(f"{where}: the repository has no config.json") from None
    except (hub.HfHubHTTPError, OSError) as err:
        raise ModelReadError(f"{where}: cannot fetch config.json ({type(err).__name__}: {err})") from None
    return Path(str(path))
