"""Memory: reserves, weights per GPU, the KV budget, what fits, utilisation and max_model_len."""

from __future__ import annotations

import math
from typing import Any

from config.draft import Draft
from config.errors import PlanError
from config.hardware import GPUInfo, NodeInfo
from config.model import ModelSpec
from config.plan import GIB
from config.settings import WorkloadSettings

DEFAULT_GPU_UTILIZATION = 0.90
CUDA_RUNTIME_RESERVE = int(1.0 * GIB)  # CUDA context, torch, CUDA graphs
TP_COMM_RESERVE = int(0.25 * GIB)  # NCCL / custom all-reduce buffers
CPU_RUNTIME_RESERVE = int(2.0 * GIB)  # the engine's Python processes and the chat app
CPU_KV_SHARE = 0.4  # at most this share of RAM left after weights goes to the KV cache
MIN_CONTEXT = 256
MIN_PINNED_CONTEXT = 16
"""The shortest context one may ask for (``workload.context``'s own lower bound, for a pin too)."""


def weights_per_gpu(model: ModelSpec, tp: int, pp: int) -> int:
    """Weights on the fullest GPU: layers split by pp and tp; embeddings split by tp only."""
    emb = model.vocab_size * model.hidden_size * model.dtype_bytes
    copies = 1 if model.tie_word_embeddings and pp == 1 else 2
    body = max(model.weight_bytes() - emb * (1 if model.tie_word_embeddings else 2), 0)
    stage_emb = emb if pp > 1 else emb * copies
    return body // (tp * pp) + stage_emb // tp


def activation_reserve(model: ModelSpec, tp: int, batched_tokens: int, max_seqs: int) -> int:
    """Peak activations of one forward pass plus fp32 logits for every sequence sampled."""
    width = 4 * model.hidden_size + 2 * model.intermediate_size // tp
    return batched_tokens * width * model.dtype_bytes + max_seqs * model.vocab_size * 4


def gpu_reserve(model: ModelSpec, tp: int, pp: int, mnbt: int, seqs: int) -> int:
    """Per GPU, not available for KV: runtime, communication buffers (when split), activations."""
    comm = TP_COMM_RESERVE if tp * pp > 1 else 0
    return CUDA_RUNTIME_RESERVE + comm + activation_reserve(model, tp, mnbt, seqs)


def kv_tokens(model: ModelSpec, tp: int, pp: int, usable: int, mnbt: int, seqs: int) -> int:
    """Tokens of KV cache per replica at this split: what weights and reserve leave, per token."""
    budget = usable - weights_per_gpu(model, tp, pp) - gpu_reserve(model, tp, pp, mnbt, seqs)
    return max(0, budget // model.kv_bytes_per_token(tp, pp))


def fits(model: ModelSpec, tp: int, pp: int, usable: int, mnbt: int, seqs: int, min_tokens: int) -> bool:
    """Whether at this split the KV cache holds at least ``min_tokens``."""
    return kv_tokens(model, tp, pp, usable, mnbt, seqs) >= min_tokens


def not_fit_error(model: ModelSpec, gpu: GPUInfo, usable: int, gpus: int, pins: dict[str, Any]) -> PlanError:
    """The model fits at no split here: say how much it needs and what would fit instead (first of
    all a higher gpu_memory_utilization when the user pinned it)."""
    w = model.weight_bytes()
    need = w + CUDA_RUNTIME_RESERVE
    n_needed = max(2, math.ceil(need / usable))
    n_pow2 = 1 << (n_needed - 1).bit_length()
    four_bit = model.param_count // 2
    hints = [f"{n_pow2} or more GPUs of {gpu.memory_bytes / GIB:g} GiB (tensor/pipeline parallel)"]
    if "gpu_memory_utilization" in pins:
        hints.insert(0, f"a higher gpu_memory_utilization than your pin of {pins['gpu_memory_utilization']}")
    if four_bit + CUDA_RUNTIME_RESERVE < usable * gpus:
        hints.append(f"4-bit quantisation (~{four_bit / GIB:.0f} GiB of weights)")
    hints.append("a smaller model")
    where = f"{gpus} x {gpu.name}" if gpus > 1 else f"one {gpu.name}"
    return PlanError(
        f"{model.source} does not fit: {w / GIB:.1f} GiB of weights in {model.dtype}, and {where} "
        f"{'give' if gpus > 1 else 'gives'} {usable * gpus / GIB:.1f} GiB usable "
        f"({gpu.memory_bytes / GIB:g} GiB x {usable / gpu.memory_bytes:.2f}); would fit: {'; '.join(hints)}"
    )


def gpu_utilization(draft: Draft, gpus: list[GPUInfo], smallest: GPUInfo, share: float = 1.0) -> int:
    """Set gpu_memory_utilization (lowered when other processes hold memory); bytes usable per GPU.
    ``share``: the part of each GPU this setup takes beside another (``Hardware.share``).

    Utilisation comes first: everything else is sized from what it leaves.
    """
    busy = max(g.memory_bytes - g.free_bytes for g in gpus)
    util = round(DEFAULT_GPU_UTILIZATION * share, 2)
    util_reason = "vLLM's usual share; the rest absorbs allocator fragmentation and the odd spike"
    if share < 1:
        util_reason = (
            f"{share:.0%} of vLLM's usual {DEFAULT_GPU_UTILIZATION}: a compared setup runs beside it on the same "
            "GPU and takes the rest (up --compare)"
        )
    if busy > 0.02 * smallest.memory_bytes:
        free = ((smallest.memory_bytes - busy) / smallest.memory_bytes - 0.02) * share
        util = max(0.05, round(min(util, free), 2))
        util_reason = f"{busy / GIB:.1f} GiB already in use by other processes; the engine takes what is free"
        if share < 1:
            util_reason += f" ({share:.0%} of it: a compared setup takes the rest)"
    util = draft.set("gpu_memory_utilization", util, util_reason)
    return int(smallest.memory_bytes * util)


def cpu_kv_cache(draft: Draft, node: NodeInfo, model: ModelSpec, workload: WorkloadSettings, pp: int = 1) -> int:
    """Set cpu_kv_cache_space_gib: room for the context or all users, within a share of spare RAM
    (per node: a pipeline stage's weights and KV when ``pp`` stages span the nodes)."""
    weights = weights_per_gpu(model, 1, pp) if pp > 1 else model.weight_bytes()
    kv_per_token = model.kv_bytes_per_token(1, pp)
    typical = workload.prompt_tokens + workload.reply_tokens
    wanted_len = workload.context or model.max_context
    spare = node.memory_bytes - weights - CPU_RUNTIME_RESERVE
    if spare <= 0:
        raise PlanError(
            f"{model.source} does not fit: {weights / GIB:.1f} GiB of weights"
            + (f" per node split over {pp} nodes" if pp > 1 else "")
            + f", and {'each node' if pp > 1 else 'this machine'} has "
            f"{node.memory_bytes / GIB:.1f} GiB of RAM ({CPU_RUNTIME_RESERVE / GIB:.0f} GiB kept for the "
            f"runtime); would fit: 4-bit quantisation (~{model.param_count / 2 / GIB:.0f} GiB) if RAM allows; "
            "a GPU; a smaller model"
        )
    want_bytes = max(wanted_len, workload.users * typical) * kv_per_token
    cap_gib = max(1, int(spare * CPU_KV_SHARE // GIB))
    kv_gib: int = draft.set(
        "cpu_kv_cache_space_gib",
        max(1, min(cap_gib, math.ceil(want_bytes / GIB))),
        f"enough for {max(wanted_len, workload.users * typical):,} tokens at {kv_per_token:,} B/token, "
        f"at most {CPU_KV_SHARE:.0%} of the RAM left after weights ({cap_gib} GiB)",
    )
    if kv_gib * GIB > spare:
        raise PlanError(
            f"cpu_kv_cache_space_gib={kv_gib}: only {spare / GIB:.1f} GiB of RAM is left after weights "
            f"and runtime; valid on this hardware: 1..{max(1, int(spare // GIB))}"
        )
    return kv_gib


def choose_max_len(draft: Draft, model: ModelSpec, workload: WorkloadSettings, kv_tokens: int, where: str) -> int:
    """The wanted context, or the model's own capped to what the KV cache holds."""
    if "max_model_len" in draft.pins or workload.context:
        wanted: int = draft.pins.get("max_model_len") or workload.context or 0
        key = "max_model_len" if "max_model_len" in draft.pins else "workload.context"
        if wanted > model.max_context:
            raise PlanError(
                f"{key}={wanted}: the model's context is {model.max_context:,} tokens; "
                f"valid: up to {model.max_context:,}"
            )
        if wanted > kv_tokens:
            raise PlanError(
                f"{key}={wanted:,}: {where} holds only {kv_tokens:,} tokens; use a context of at most "
                f"{kv_tokens:,}, more memory (more GPUs or higher gpu_memory_utilization), or a smaller model"
            )
        if wanted < MIN_PINNED_CONTEXT:
            raise PlanError(f"{key}={wanted}: a context holds at least {MIN_PINNED_CONTEXT} tokens")
        typical = workload.prompt_tokens + workload.reply_tokens
        if wanted < typical:
            draft.warnings.append(
                f"{key}={wanted:,} is shorter than a typical request ({workload.prompt_tokens:,} prompt + "
                f"{workload.reply_tokens:,} reply tokens, workload.prompt_tokens and reply_tokens): chats keep fewer "
                "earlier turns and longer prompts are refused"
            )
        return draft.set("max_model_len", wanted, "the context you asked for; it fits in the KV cache")
    if model.max_context <= kv_tokens:
        return draft.set(
            "max_model_len",
            model.max_context,
            f"the model's full context ({model.max_context:,}); the KV cache holds {kv_tokens:,} tokens",
        )
    capped = max(MIN_CONTEXT, kv_tokens // 1024 * 1024 or kv_tokens)
    if capped > kv_tokens:
        raise PlanError(
            f"{model.source}: the KV cache would hold only {kv_tokens} tokens, fewer than the minimum "
            f"context of {MIN_CONTEXT}; use more GPUs, a higher gpu_memory_utilization or a smaller model"
        )
    return draft.set(
        "max_model_len",
        capped,
        f"the model allows {model.max_context:,} but {where} holds {kv_tokens:,} tokens; capped so one "
        "full-length request always fits",
    )
