"""Batching: max_num_seqs (sequences per engine step) and max_num_batched_tokens (the prefill chunk).

Measured with ``tune`` on 1 and 2 x H200: prefill chunks of 8192 beat 4096 by 7 % on big GPUs;
with replicas each one needs room for all users (vLLM's balancer is uneven).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.hardware import GPUInfo
from config.plan import GIB
from config.settings import WorkloadSettings

if TYPE_CHECKING:
    from config.planner import Draft

BIG_GPU_BYTES = 70 * GIB
"""From this size on (H100, H200, B200) a step of 8192 prompt tokens still leaves decode fast."""

SEQS_CAP = {"throughput": 512, "balanced": 256, "latency": 64}
"""Most sequences per GPU replica, by objective."""
SEQS_FLOOR = {"throughput": 64, "balanced": 16, "latency": 8}
"""Fewest sequences per GPU replica, by objective (when the KV cache holds them)."""


def prefill_chunk(objective: str, gpu: GPUInfo) -> tuple[int, str]:
    """max_num_batched_tokens (prompt tokens per engine step) and why.

    Measured on one H200 (BENCHMARKS.md, tune): 8192 gave 7 % more tokens/s than 4096 at 32
    concurrent with lower p99 TTFT and ITL, so big GPUs get 8192 unless the objective is latency;
    vLLM's own server default draws the same line (70 GiB, not A100). Others keep 4096
    (unmeasured; vLLM uses 2048 there).
    """
    if objective == "throughput":
        return 8192, "large prefill chunks for throughput"
    if objective == "balanced" and gpu.memory_bytes >= BIG_GPU_BYTES and "a100" not in gpu.name.lower():
        return 8192, (
            f"{gpu.memory_bytes / GIB:.0f} GiB GPU: chunks of 8192 prompt tokens measured 7 % faster than "
            "4096 on an H200 with no cost to other users' token pace"
        )
    return 4096, "prefill chunks of 4096 tokens keep other users' tokens flowing while a long prompt is read"


def gpu_max_num_seqs(draft: Draft, workload: WorkloadSettings, seqs_fit: int, dp: int, users_per_replica: int) -> int:
    """Set max_num_seqs per GPU replica (not per GPU); warn when the KV cache holds fewer than the users."""
    typical = workload.prompt_tokens + workload.reply_tokens
    cap = SEQS_CAP[workload.objective]
    floor = SEQS_FLOOR[workload.objective]
    # Replicas are sized for all users, not their share: vLLM's balancer does not split the load
    # evenly (2 x H200, 32 concurrent: 16 per replica queued, p99 TTFT 238 ms; 32 per replica:
    # 110 ms and 14 % more tokens/s, ahead of TP=2).
    want = max(floor, 4 * workload.users)
    room = (
        f"room for 4x the {workload.users} users"
        if dp == 1
        else f"room for 4x all {workload.users} users on each of the {dp} replicas, since vLLM's balancer "
        "does not split them evenly (measured: half that room queued requests on 2 x H200)"
    )
    seqs_value = max(1, min(seqs_fit, want, cap))
    if seqs_value >= 8:  # a batch size vLLM captures a CUDA graph for (its capture sizes step by 8)
        seqs_value -= seqs_value % 8
    seqs: int = draft.set(
        "max_num_seqs",
        seqs_value,
        f"per replica (not per GPU): {room} (at least {floor}, at most {cap} for '{workload.objective}', "
        "a multiple of 8: a CUDA-graph batch size); "
        f"KV holds {seqs_fit:,} sequences of {typical} tokens",
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
