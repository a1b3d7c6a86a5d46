"""Batching: max_num_seqs (sequences per engine step) and max_num_batched_tokens (the prefill chunk).

Prefill chunks of 8192 on big GPUs (BENCHMARKS.md#prefill-chunk); with replicas each one has room for
all users, since vLLM's balancer is uneven (BENCHMARKS.md#two-gpus-replicas-not-tp).
"""

from __future__ import annotations

from config.draft import Draft
from config.hardware import GPUInfo, Hardware
from config.plan import GIB
from config.settings import WorkloadSettings

BIG_GPU_BYTES = 70 * GIB
"""From this size on (H100, H200, B200) a step of 8192 prompt tokens still leaves decode fast."""


def vllm_default_batch(hardware: Hardware) -> tuple[int, int]:
    """vLLM's own max_num_seqs and max_num_batched_tokens for its API server (``vllm/engine/arg_utils.py``):
    by the first GPU's memory and name, or the CPU engine's for one process (what ``vllm serve MODEL`` runs)."""
    gpus = [g for g in hardware.node.gpus if g.runs_vllm]
    if not hardware.has_gpu or not gpus:
        return 128, 2048
    gpu = min(gpus, key=lambda g: g.index)
    if gpu.memory_bytes >= 160 * GIB:
        return 1024, 16384
    if gpu.memory_bytes >= BIG_GPU_BYTES and "a100" not in gpu.name.lower():
        return 1024, 8192
    return 256, 2048


SEQS_CAP = {"throughput": 512, "balanced": 256, "latency": 64}
"""Most sequences per GPU replica, by objective."""
SEQS_FLOOR = {"throughput": 64, "balanced": 16, "latency": 8}
"""Fewest sequences per GPU replica, by objective (when the KV cache holds them)."""


def prefill_chunk(objective: str, gpu: GPUInfo) -> tuple[int, str]:
    """max_num_batched_tokens (prompt tokens per engine step) and why: 8192 on big GPUs unless the
    objective is latency (BENCHMARKS.md#prefill-chunk; vLLM's own server default draws the same line:
    70 GiB, not A100); others keep 4096 (unmeasured; vLLM uses 2048 there)."""
    if objective == "throughput":
        return 8192, "large prefill chunks for throughput"
    if objective == "balanced" and gpu.memory_bytes >= BIG_GPU_BYTES and "a100" not in gpu.name.lower():
        return 8192, (
            f"{gpu.memory_bytes / GIB:.0f} GiB GPU: chunks of 8192 prompt tokens gave 1.07x the tokens/s of 4096 "
            "with a lower p99 TTFT (BENCHMARKS.md#prefill-chunk)"
        )
    return 4096, "prefill chunks of 4096 tokens keep other users' tokens flowing while a long prompt is read"


def gpu_max_num_seqs(draft: Draft, workload: WorkloadSettings, seqs_fit: int, dp: int, users_per_replica: int) -> int:
    """Set max_num_seqs per GPU replica (not per GPU); warn when the KV cache holds fewer than the users."""
    typical = workload.prompt_tokens + workload.reply_tokens
    cap = SEQS_CAP[workload.objective]
    floor = SEQS_FLOOR[workload.objective]
    # Replicas are sized for all users, not their share: vLLM's balancer does not split the load
    # evenly (BENCHMARKS.md#two-gpus-replicas-not-tp).
    want = max(floor, 4 * workload.users)
    room = (
        f"room for 4x the {workload.users} users"
        if dp == 1
        else f"room for 4x all {workload.users} users on each of the {dp} replicas (vLLM's balancer splits them "
        "unevenly, BENCHMARKS.md#two-gpus-replicas-not-tp)"
    )
    seqs_value = max(1, min(seqs_fit, want, cap))
    if seqs_value >= 8:  # a batch size vLLM captures a CUDA graph for (its capture sizes step by 8)
        seqs_value -= seqs_value % 8
    seqs: int = draft.set(
        "max_num_seqs",
        seqs_value,
        f"per replica, not per GPU: {room}, {floor}-{cap} for '{workload.objective}'; "
        f"the KV cache holds {seqs_fit:,} sequences of {typical} tokens",
    )
    if seqs_fit < users_per_replica:
        draft.warnings.append(
            f"the KV cache holds {seqs_fit} sequences of {typical} tokens per replica, fewer than the "
            f"{users_per_replica} expected users: requests will queue"
        )
    return seqs


def gpu_max_num_batched_tokens(draft: Draft, mnbt: int, seqs: int, reason: str) -> int:
    """Set max_num_batched_tokens: the prefill chunk, at least one token per sequence."""
    return draft.set("max_num_batched_tokens", max(mnbt, seqs), reason)


def cpu_batching(draft: Draft, workload: WorkloadSettings, cpu_cores: int, seqs_fit: int) -> None:
    """Set max_num_seqs and max_num_batched_tokens for the CPU engine."""
    typical = workload.prompt_tokens + workload.reply_tokens
    draft.set(
        "max_num_seqs",
        max(1, min(seqs_fit, max(4, 2 * workload.users), 64)),
        f"per engine: twice the {workload.users} expected users (at least 4); a "
        f"{cpu_cores}-core CPU gains nothing from bigger batches; KV holds {seqs_fit:,} "
        f"sequences of {typical} tokens",
    )
    draft.set(
        "max_num_batched_tokens",
        max(2048, draft.values["max_num_seqs"]),
        "prefill chunk of 2048 tokens: long prompts are split so other users' tokens keep flowing",
    )
