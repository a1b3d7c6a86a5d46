"""CUDA graphs: which engine steps vLLM replays as one graph instead of launching kernel by kernel.

vLLM 0.24's own choice (``FULL_AND_PIECEWISE``, steps up to 2 x max_num_seqs and at most 512
tokens) graphs pure decode steps only as a whole. Under load nearly every step also reads a new
prompt (at 128 concurrent with 128-token replies, one request ends and one starts per step), and
a step of one 512-token prompt beside the running sequences' next tokens is over 512 tokens: it
runs without graphs. For a small model on Hopper and later the plan graphs those steps too (``FULL``,
steps up to 1024 tokens; BENCHMARKS.md#whole-step-cuda-graphs).
"""

from __future__ import annotations

from config.draft import Draft, Work
from config.hardware import GPUInfo
from config.model import ModelSpec
from config.rules.frontend import host_bound

FULL_GRAPH_CAPABILITY = (9, 0)
"""Hopper and later: vLLM runs FlashAttention 3 there, whose attention it can capture in a graph for
steps that mix prompts and decodes (``AttentionCGSupport.ALWAYS``); FA2 on older GPUs cannot."""
GRAPH_TOKENS = 1024
"""Largest step captured: one 512-token prompt beside up to 512 sequences' next tokens
(BENCHMARKS.md#whole-step-cuda-graphs)."""


def _why_not_whole_steps(gpus: list[GPUInfo], model: ModelSpec) -> str:
    """Why whole steps are not graphed here, or "" where they are."""
    oldest = min(g.compute_capability for g in gpus)
    if not host_bound(model):
        return "a big model's steps are long beside their kernel launches (unmeasured)"
    if oldest < FULL_GRAPH_CAPABILITY:
        return (
            f"compute capability {oldest[0]}.{oldest[1]} runs FlashAttention 2, which vLLM cannot graph in a step "
            "that reads a prompt"
        )
    return ""


def whole_step_graphs(draft: Draft, gpus: list[GPUInfo], model: ModelSpec) -> bool:
    """Whether the plan will graph whole steps (``FULL``, pinned or the planner's), and vLLM can: a
    FULL pin where FlashAttention 2 runs graphs pure decode steps only. Engines per GPU hang on it, so it
    is read from the pins and the GPUs, not from cudagraph_mode on the draft."""
    return draft.pins.get("cudagraph_mode", "FULL") == "FULL" and not _why_not_whole_steps(gpus, model)


def gpu_graphs(draft: Draft, gpus: list[GPUInfo], model: ModelSpec, max_num_batched_tokens: int) -> None:
    """Set cudagraph_mode and max_cudagraph_capture_size: whole steps as graphs for a small model on
    Hopper or later (measured), vLLM's own choice elsewhere (unmeasured)."""
    if why_not := _why_not_whole_steps(gpus, model):
        mode = draft.set("cudagraph_mode", "auto", f"vLLM's own (FULL_AND_PIECEWISE): {why_not}")
    else:
        mode = draft.set(
            "cudagraph_mode",
            "FULL",
            "whole steps as CUDA graphs, those that read a prompt too (vLLM's own graphs only pure decode steps "
            "whole): 1.24x / 1.19x the tokens/s at 128 / 256 users (BENCHMARKS.md#whole-step-cuda-graphs)",
        )
    if mode == "auto":
        draft.set("max_cudagraph_capture_size", 0, "vLLM's own: 2 x max_num_seqs, at most 512 tokens")
        return
    size = min(GRAPH_TOKENS, max_num_batched_tokens)
    draft.set(
        "max_cudagraph_capture_size",
        size,
        f"steps of up to {size} tokens as graphs: one 512-token prompt beside the running sequences is over vLLM's "
        "own 512; 1024 took 0.6 GiB per engine (BENCHMARKS.md#whole-step-cuda-graphs)",
    )


def cpu_graphs(work: Work) -> None:
    """Set both to vLLM's own on the CPU engine (a pin of anything else is refused by the plan's check)."""
    draft = work.draft
    draft.set("cudagraph_mode", "auto", "the CPU engine runs no CUDA graphs")
    draft.set("max_cudagraph_capture_size", 0, "the CPU engine runs no CUDA graphs")
