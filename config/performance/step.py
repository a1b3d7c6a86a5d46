"""One engine step's time: the host's share (the engine core) and the device's (weights and KV read
against memory bandwidth, prompts computed against the device's FLOP/s), and the API servers' pace.

A step runs every running sequence's next token and up to ``max_num_batched_tokens`` prompt tokens.
With async scheduling the host prepares the next step while the GPU runs this one, so the longer of the
two sets the pace; without it (the CPU engine, or async off) they add up. An API server that cannot
stream the tokens as fast as the engine makes them sets the pace too (vLLM's defaults at 128 users:
one API server, every token a chunk, BENCHMARKS.md#api-servers-and-stream-interval); vLLM's Rust frontend
spends a share of a Python server's CPU on each token and works on several cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from config.model import ModelSpec
from config.performance.costs import HostCosts
from config.performance.layout import Layout

MEMORY_EFFICIENCY = 0.75
"""Share of the spec sheet's bandwidth a step's weight and KV reads reach."""
ASSUMED_BANDWIDTH_GBS = 900.0
ASSUMED_TFLOPS = 120.0
"""A GPU whose figures no profile gives (a detected one): a mid-range card's, and the band says so."""
ALLREDUCE_S = {"nvlink": 12e-6, "pcie": 25e-6}
"""One all-reduce's fixed time between TP ranks (2 x H200 over NVLink, TP=2 at 1 user: 0.49 ms more per
step than one GPU for 36 of them, BENCHMARKS.md#two-gpus-replicas-not-tp)."""
LINK_BYTES_S = {"nvlink": 300e9, "pcie": 20e9}
STAGE_HOP_S = {"node": 300e-6, "gpu": 50e-6}
"""A pipeline stage hands its activations to the next: over the network, or between GPUs of one node."""
EXECUTOR_STEP_MS = 0.3
"""A step's hand-over to several worker processes (the ``mp`` executor)."""
WIDTH_HALF = 3072
"""The hidden size at which a prompt's products reach half the asymptotic share of the GPU's peak: a small
model's matrices are too thin to fill it (ERNIE-4.5-0.3B, hidden 1,024: a quarter)."""
PIECEWISE = 0.5
"""A piecewise-graphed step launches its attention layer by layer: about half an eager step's launches."""


@dataclass(frozen=True)
class ShapeCosts:
    """The model's work per token, per GPU of one engine."""

    linear_flops: float
    """2 x the active parameters outside the embeddings, per token, per TP rank."""
    head_flops: float
    """2 x vocabulary x hidden per sampled token (the LM head), per TP rank."""
    attention_flops: float
    """4 x heads x head_dim x layers per (query token, earlier token) pair, per TP rank."""
    layers: int
    moe_idle_share: float
    """Share of the weights in routed experts a token does not visit (0 for a dense model)."""
    experts_share: float
    """top-k / experts: a token's share of the routed experts."""
    hidden_bytes: float
    """One token's activations between ranks or stages."""
    width_share: float
    """Share of the asymptotic efficiency this model's widths reach (``WIDTH_HALF``)."""

    @classmethod
    def of(cls, model: ModelSpec, tp: int, dtype_bytes: int) -> ShapeCosts:
        linear = max(model.active_param_count - model.embedding_param_count, 1)
        idle = (model.param_count - model.active_param_count) / model.param_count if model.is_moe else 0.0
        return cls(
            linear_flops=2.0 * linear / tp,
            head_flops=2.0 * model.vocab_size * model.hidden_size / tp,
            attention_flops=4.0 * model.num_attention_heads * model.head_dim * model.num_layers / tp,
            layers=model.num_layers,
            moe_idle_share=idle,
            experts_share=model.experts_per_token / model.num_experts if model.is_moe else 1.0,
            hidden_bytes=float(model.hidden_size * dtype_bytes),
            width_share=model.hidden_size / (model.hidden_size + WIDTH_HALF),
        )


@dataclass(frozen=True)
class Step:
    """A step's duration and what it was made of (seconds)."""

    duration: float
    host_fixed: float
    host_seq: float
    host_prompt: float
    memory: float
    compute: float
    comm: float
    api: float

    @property
    def device(self) -> float:
        return max(self.memory, self.compute) + self.comm

    def cause(self) -> str:
        """What set this step's duration: the largest of its parts."""
        parts = {
            "host_step": self.host_fixed,
            "host_seq": self.host_seq,
            "host_prompt": self.host_prompt,
            "memory": self.memory if self.memory >= self.compute else 0.0,
            "compute": self.compute if self.compute > self.memory else 0.0,
            "comm": self.comm,
            "api": self.api,
        }
        return max(parts, key=lambda k: parts[k])


@dataclass
class StepModel:
    """The step times of one engine core of ``layout`` with ``costs``; ``host`` and ``device`` are the
    contention factors (CPU cores shared by more processes than cores, a GPU shared by engines)."""

    layout: Layout
    costs: HostCosts
    shape: ShapeCosts
    host: float = 1.0
    device_share: float = 1.0

    @property
    def bandwidth(self) -> float:
        """Bytes/s an engine's reads stream at (per GPU; the CPU engine: its cores', less what the other processes
        take of them, as its compute)."""
        lay = self.layout
        if lay.device == "cpu":
            return lay.cores_per_node * self.costs.cpu_memory_gbs * 1e9 * MEMORY_EFFICIENCY / self.host
        gbs = lay.gpu.memory_bandwidth_gbs if lay.gpu and lay.gpu.memory_bandwidth_gbs else ASSUMED_BANDWIDTH_GBS
        return gbs * 1e9 * MEMORY_EFFICIENCY

    @property
    def flops(self) -> float:
        """FLOP/s a prompt's products reach (per GPU; the CPU engine: its OpenMP threads, less what the
        other processes take of the cores)."""
        lay = self.layout
        if lay.device == "cpu":
            return lay.compute_threads * self.costs.cpu_gflops_per_core * 1e9 / self.host
        tflops = lay.gpu.bf16_tflops if lay.gpu and lay.gpu.bf16_tflops else ASSUMED_TFLOPS
        return tflops * 1e12 * self.costs.gpu_efficiency * self.shape.width_share

    def graphed_share(self, tokens: int, prefill: bool) -> float:
        """Share of an eager step's kernel launches this step pays: 0 replayed whole as a graph."""
        lay = self.layout
        if lay.device == "cpu":
            return 0.0
        fits = tokens <= lay.graph_tokens
        if lay.graph_mode == "FULL":
            return 0.0 if fits else 1.0
        if lay.graph_mode == "FULL_AND_PIECEWISE":
            return (PIECEWISE if prefill else 0.0) if fits else 1.0
        if lay.graph_mode == "PIECEWISE":
            return PIECEWISE if fits else 1.0
        return 1.0

    def time(
        self, decode: int, context: float, prefill: list[tuple[int, int]], sampled: int, share: float | None = None
    ) -> Step:
        """A step of ``decode`` running sequences holding ``context`` tokens together, and prompt chunks
        ``(tokens, tokens before it)``, sampling ``sampled`` tokens; ``share``: a shared GPU's slowing of this
        step alone (default ``device_share``, its mean)."""
        lay, c, s = self.layout, self.costs, self.shape
        prompt = sum(n for n, _ in prefill)
        tokens = decode + prompt
        pairs = context + sum(n * (before + (n + 1) / 2) for n, before in prefill)
        flops = s.linear_flops * tokens + s.head_flops * sampled + s.attention_flops * pairs
        compute = flops / self.flops
        visited = 1.0 - s.moe_idle_share * (1.0 - min(1.0, tokens * s.experts_share))
        read = lay.weights_bytes * visited * lay.pp + context * lay.kv_bytes_per_token * lay.pp
        memory = read / self.bandwidth
        comm = 0.0
        if lay.tp > 1:
            link = "nvlink" if lay.nvlink else "pcie"
            comm += 2 * s.layers * (ALLREDUCE_S[link] + tokens * s.hidden_bytes / LINK_BYTES_S[link])
        if lay.pp > 1:
            hop = STAGE_HOP_S["node" if lay.split_nodes else "gpu"]
            comm += (lay.pp - 1) * (hop + tokens * s.hidden_bytes / LINK_BYTES_S["pcie"])
        if lay.device == "cuda":
            slowing = self.device_share if share is None else share
            memory, compute = memory * slowing, compute * slowing
        h = self.host
        fixed = c.step_ms * 1e-3 * lay.pp + c.launch_layer_us * 1e-6 * s.layers * self.graphed_share(
            tokens, bool(prefill)
        )
        if lay.tp * lay.pp > 1:
            fixed += EXECUTOR_STEP_MS * 1e-3
        host_fixed, host_seq, host_prompt = fixed * h, c.seq_us * 1e-6 * decode * h, c.prompt_us * 1e-6 * prompt * h
        host = host_fixed + host_seq + host_prompt
        device = max(memory, compute) + comm
        duration = max(host, device) if lay.async_scheduling else host + device
        api = decode * self.api_token_s / self.api_capacity
        return Step(max(duration, api, 1e-6), host_fixed, host_seq, host_prompt, memory, compute, comm, api)

    @property
    def api_capacity(self) -> float:
        """Cores an engine core's API side works on at once: a core per Python API server; the Rust frontend's
        threads (``RustFrontendShares.threads``)."""
        lay = self.layout
        threads = self.costs.rust_frontend.threads if lay.rust_frontend else 1.0
        return max(lay.api_servers * threads, 1e-9)

    @property
    def api_token_s(self) -> float:
        """An API server's CPU seconds per output token: its own and its share of the chunk."""
        c = self.costs
        return (c.token_us + c.chunk_us / self.layout.stream_interval) * 1e-6 * self.host

    def request_s(self, prompt: int) -> float:
        """An API server's CPU seconds to take one request in."""
        c = self.costs
        return (c.request_ms * 1e-3 + c.tokenize_us * 1e-6 * prompt) * self.host


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks; 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
