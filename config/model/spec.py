"""What the planner needs to know about a model: its shape, and the byte counts derived from it.

The numbers are estimates with documented simplifications (see ``count_params`` and
``kv_bytes_per_token``); they are good to a few percent, which is what sizing TP/PP needs.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from config.errors import ModelReadError, PlanError

Dtype = Literal["bfloat16", "float16", "float32"]
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}


class ModelSpec(BaseModel):
    """A model's shape as the planner uses it: sizes, experts, dtype and derived byte counts."""

    model_config = ConfigDict(frozen=True)

    source: str
    """The Hugging Face id or local path it was read from."""
    architecture: str
    """The served class from ``architectures`` (its first chat-model class, or the one string
    given); empty when config.json does not list one."""
    model_type: str
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    """``num_key_value_heads``; equal to the attention heads for plain multi-head attention, and
    always a divisor of them."""
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
        if self.num_attention_heads % self.num_kv_heads:
            raise ModelReadError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.num_experts and self.experts_per_token > self.num_experts:
            raise ModelReadError(f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}")
        if self.num_moe_layers > self.num_layers:
            raise ModelReadError(f"num_moe_layers={self.num_moe_layers} exceeds num_layers={self.num_layers}")
        if "param_count" not in self.model_fields_set:
            self.__dict__["param_count"] = count_params(self)
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.num_moe_layers > 0

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

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
            raise PlanError(f"tp and pp must be >= 1, got tp={tp} pp={pp}")
        layers = math.ceil(self.num_layers / pp)
        heads = max(1, self.num_kv_heads // tp)
        width = kv_dtype_bytes if kv_dtype_bytes is not None else self.dtype_bytes
        return 2 * layers * heads * self.head_dim * width


# Model types whose MLP is up/down only (two matrices), not gated (three).
UNGATED_MLP_TYPES = frozenset(
    {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "falcon", "phi", "opt", "bloom", "starcoder2"}
)
# Model types with four norms per layer (pre/post attention and pre/post MLP) instead of two.
_FOUR_NORM_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text"})
# Model types with per-head RMS norms on q and k (head_dim weights each, per layer).
_QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text"})


def count_params(spec: ModelSpec) -> int:
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
    dense_mlp = (2 if spec.model_type in UNGATED_MLP_TYPES else 3) * h * spec.intermediate_size
    moe_layers = spec.num_moe_layers if spec.num_experts else 0
    moe_mlp = (
        h * spec.num_experts + spec.num_experts * spec.expert_param_count + 3 * h * spec.shared_expert_intermediate_size
    )
    layers = spec.num_layers * (attention + norms)
    layers += (spec.num_layers - moe_layers) * dense_mlp + moe_layers * moe_mlp
    return spec.embedding_param_count + layers + h
