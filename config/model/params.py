"""Parameter count from a model's shape (config.json alone: planning needs no weights)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from config.model.spec import ModelSpec

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
