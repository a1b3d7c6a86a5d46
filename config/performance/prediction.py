"""What a plan delivers under a load: TTFT p50 / p99, TPOT p50, output tokens/s in all and per user, each
a point and a band, and what bounds it.

Users are spread over the engine cores as the router (or vLLM's balancer) does; each core is simulated
(``simulate``) with its users, or, where the router takes each request to the engines in turn (each a
conversation of its own, ``Load.sessions``), the cores are simulated together. What the cores share is
settled by a few rounds of a fixed point: the host's cores (a busy-waiting engine core each, API servers,
router and page by their load; more demand than cores slows every host cost) and a GPU shared by several
engines (the others' device time in its way, less under MPS, whose kernels run at once: at its mean, or
step by step where the cores are simulated together). The band is the same prediction with the host's costs and the
device's rates a calibration's error apart (wider before any calibration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from config.model import ModelSpec
from config.performance.costs import HostCosts
from config.performance.layout import Layout
from config.performance.simulate import EngineRun, Front, Pool, SharedGpu, simulate
from config.performance.step import ShapeCosts, StepModel, percentile

Path = Literal["api", "page"]
Sessions = Literal["user", "request"]
ROUNDS = 4
"""Fixed-point rounds for what engines share (host cores, a GPU)."""
REQUESTS_PER_USER = 4
MIN_REQUESTS = 32
"""``vllm bench serve``'s count: max(32, 4 x concurrency)."""
MAX_SIMULATED = 2048
"""Requests simulated per engine core at most: a bigger load sends fewer per user (one at least)."""
TOGETHER = 4
"""Engine cores simulated together where the router takes requests to them in turn: more stand for as many
again each (their users in proportion)."""
ORDERS = 3
"""Where the router takes requests in turn, runs with up to that many orders within its rounds, pooled (fewer
where they would simulate more than ``MAX_SIMULATED`` requests per engine core): which engine a burst's
requests reach moves each run's figures, as the runs of one level differ."""
SETTLED = 0.01
"""The fixed point holds once neither slowing moves by more than this share."""
BAND = {"calibrated": 0.15, "default": 0.35}
"""How far the host's costs may be from the ones used, by their kind: the band's two ends."""
ASSUMED_DEVICE_BAND = 0.5
"""The device rates' spread where no profile gives the GPU's figures."""
BUSY_WAIT_CORES = 1.0
"""A GPU engine core spins on its step's end: a core each (BENCHMARKS.md#engines-per-gpu)."""
MPS_WEIGHT = 0.5
"""Under MPS the other engines' kernels run beside this one's: about half their time is in its way."""
HOST_LOAD = 0.7
"""Each host process is slower by up to this share as the cores fill (lower clocks, shared caches)."""
OVERSUBSCRIBED = 0.1
"""Demand this far beyond the cores names them the bound."""
WORKER_HOST_SHARE = 0.2
"""The CPU engine's worker keeps its threads busy this much beyond its compute: its Python between kernels."""
NICE_CORE_SHARE = 0.1
"""An engine core at nice 19 yields its core to whatever else wants it."""


@dataclass(frozen=True)
class Load:
    """Who uses it: ``users`` at once, each sending the next request when a reply ends."""

    users: int
    prompt_tokens: tuple[int, ...]
    """Prompt lengths, taken in turn (one: every prompt that long)."""
    reply_tokens: int
    requests: int | None = None
    """Requests in all; None: ``vllm bench serve``'s max(32, 4 x users)."""
    path: Path = "api"
    """'api': straight to the engine's API (``bench``'s direct path); 'page': through the chat page."""
    sessions: Sessions = "user"
    """'user': a user's requests are one session, which the router keeps on one engine (the page, ``bench``);
    'request': each request a session of its own (``vllm bench serve`` names every request apart), which
    the router sends to the engine with the fewest sessions: to the engines in turn."""
    sampled: bool = True
    """Tokens drawn at random (the page's temperature and top-p; ``vllm bench serve`` against a checkpoint whose
    generation config samples), not greedily (``bench``'s requests): ``HostCosts.sample_us`` per sequence."""

    def __post_init__(self) -> None:
        if self.users < 1 or self.reply_tokens < 1 or not self.prompt_tokens or min(self.prompt_tokens) < 1:
            raise ValueError("a load needs at least one user, one prompt token and one reply token")


class Figure(BaseModel):
    """A predicted figure: the point and the band around it."""

    point: float
    low: float
    high: float

    def inside(self, measured: float) -> bool:
        return self.low <= measured <= self.high


class Prediction(BaseModel):
    """What ``layout`` delivers under one load."""

    layout: str
    users: int
    prompt_tokens: list[int]
    reply_tokens: int
    path: Path
    ttft_p50_ms: Figure
    ttft_p99_ms: Figure
    tpot_p50_ms: Figure
    output_tokens_per_s: Figure
    per_user_tokens_per_s: Figure
    """A user's decode speed (1000 / TPOT p50), what the page's footer shows as tok/s."""
    queue_ms: float
    """Mean wait of a request before its prompt is read: front-end queues, a free slot."""
    bound: str
    """What sets the pace (a key of ``BOUNDS``)."""
    bound_text: str
    shares: dict[str, float] = Field(default_factory=dict)
    """Share of the requests' time each cause held (the bound is the largest)."""
    host_contention: float = 1.0
    """Host CPU demand over its cores (above 1: every host cost slower by as much)."""
    gpu_contention: float = 1.0
    """A shared GPU's slowing of one engine's device time."""
    costs: str
    """Where the host's costs came from (``HostCosts.source``)."""
    notes: list[str] = Field(default_factory=list)


BOUNDS = {
    "host_step": "host CPU per step (engine core and worker: scheduling, launching, sampling)",
    "host_seq": "host CPU per token (engine core, per running sequence)",
    "host_prompt": "host CPU per prompt token (engine core)",
    "api": "host CPU per token in the API servers (detokenising, streaming)",
    "memory": "memory bandwidth (weights and KV read every step)",
    "compute": "prefill compute",
    "comm": "TP/PP communication between GPUs or nodes",
    "slot": "queueing for a batch slot (max_num_seqs or KV capacity)",
    "front": "queueing in the front end (API servers, router, page)",
    "cores": "host CPU cores (more busy processes than cores)",
}


@dataclass
class _Outcome:
    ttft: list[float]
    tpot: list[float]
    queue: list[float]
    tokens_per_s: float
    causes: dict[str, float]
    host: float
    device: float
    oversubscribed: bool
    """More busy processes than the host's cores."""


def _spread(users: int, engines: int) -> list[tuple[int, int]]:
    """(users on an engine, engines with that many): as even as the router keeps them."""
    low, extra = divmod(users, engines)
    groups = [(low + 1, extra), (low, engines - extra)]
    return [(u, n) for u, n in groups if u > 0 and n > 0]


def _per_user(load: Load) -> int:
    total = load.requests if load.requests is not None else max(MIN_REQUESTS, REQUESTS_PER_USER * load.users)
    return max(1, round(total / load.users))


def _run(
    layout: Layout, model: ModelSpec, load: Load, costs: HostCosts, settled: tuple[float, float] | None = None
) -> _Outcome:
    """Each distinct engine core simulated with its users; ``settled``: the host's and the GPU's slowing as
    a run with other costs settled them (one round then), else found here (a few rounds, until they hold)."""
    costs = costs.front_end(layout.rust_frontend).drawing(load.sampled)
    shape = ShapeCosts.of(model, layout.tp, layout.dtype_bytes)
    host, device = settled or (1.0, 1.0)
    runs: list[tuple[EngineRun, float]] = []
    for _ in range(1 if settled else ROUNDS):
        step = StepModel(layout, costs, shape, host=host, device_share=device)
        runs = _simulated(step, load, host)
        if settled:
            break
        new_host = _host_demand(layout, costs, load, runs, step)
        new_device = _gpu_share(layout, load, runs, shape.width_share)
        if abs(new_host - host) <= SETTLED * host and abs(new_device - device) <= SETTLED * device:
            break
        host, device = (host + new_host) / 2, (device + new_device) / 2
    if _in_turn(layout, load):  # the GPU's slowing was each step's: its mean, as shown
        alone = sum(r.device_alone_s for r, _ in runs)
        device = sum(r.device_s for r, _ in runs) / alone if alone > 0 else 1.0
    return _outcome(runs, layout, host, device)


def _simulated(step: StepModel, load: Load, host: float) -> list[tuple[EngineRun, float]]:
    """Each engine core's run and how many cores it stands for. Requests taken in turn (``Load.sessions``)
    behind the router: up to ``TOGETHER`` cores together; else each distinct core alone with its users."""
    layout = step.layout
    per_user = _per_user(load)
    if _in_turn(layout, load):
        gpu = _shared_gpu(layout, step.shape.width_share)
        cores = min(layout.engines, max(gpu.engines, TOGETHER // gpu.engines * gpu.engines))
        users = max(1, round(load.users * cores / layout.engines))
        each = _requests_each(max(1, users // cores), per_user)
        orders = max(1, min(ORDERS, MAX_SIMULATED * cores // (users * each)))
        return [
            (run, layout.engines / cores / orders)
            for seed in range(orders)
            for run in simulate(
                step,
                [_front(step, load, host) for _ in range(cores)],
                users,
                load.prompt_tokens,
                load.reply_tokens,
                each,
                in_turn=True,
                seed=seed,
                gpu=gpu,
            )
        ]
    return [
        (simulate(step, [_front(step, load, host)], users, load.prompt_tokens, load.reply_tokens, each)[0], count)
        for users, count in _spread(load.users, layout.engines)
        for each in [_requests_each(users, per_user)]
    ]


def _in_turn(layout: Layout, load: Load) -> bool:
    """The router takes each request to the engines in turn: they are simulated together, a shared GPU's
    slowing step by step."""
    return load.sessions == "request" and layout.routed and layout.engines > 1


def _requests_each(users: int, per_user: int) -> int:
    """Requests each of an engine core's users sends in the simulation: as the load says, fewer (at least
    one) where that would be more than ``MAX_SIMULATED``."""
    return max(1, min(per_user, MAX_SIMULATED // users))


def _front(step: StepModel, load: Load, host: float) -> Front:
    """A fresh front end (its queues empty) for one engine core's simulation."""
    layout, costs = step.layout, step.costs
    page = None
    if load.path == "page":
        page = Pool(max(layout.page_processes / layout.engines, 1e-3))
    return Front(
        page=page,
        page_s=costs.page_ms * 1e-3 * host,
        router_s=costs.router_ms * 1e-3 * host if layout.routed else 0.0,
        latency_s=costs.latency_ms * 1e-3,
        api=Pool(step.api_capacity),
    )


def _host_demand(
    layout: Layout, costs: HostCosts, load: Load, runs: list[tuple[EngineRun, float]], step: StepModel
) -> float:
    """The host's slowing of every CPU cost: its cores' demand at these runs' rates, over its cores."""
    c = costs
    per_node = max(1, min(layout.engines_per_node, math.ceil(load.users / layout.nodes)))  # the ones with users
    busiest = max((r for r, _ in runs), key=lambda r: r.tokens / r.makespan)
    tokens_s, requests_s = busiest.tokens / busiest.makespan, busiest.requests / busiest.makespan
    prompt = busiest.prompt_tokens / max(busiest.requests, 1)
    api = tokens_s * step.api_token_s / step.host + requests_s * step.request_s(int(prompt)) / step.host
    chunks_s = tokens_s / layout.stream_interval
    router = (requests_s * c.router_ms * 1e-3 + chunks_s * c.router_chunk_us * 1e-6) if layout.routed else 0.0
    page = requests_s * c.page_ms * 1e-3 if load.path == "page" else 0.0
    if layout.device == "cpu":
        engine = layout.compute_threads * min(1.0, busiest.device_s / busiest.makespan + WORKER_HOST_SHARE)
        engine += NICE_CORE_SHARE if layout.engine_core_nice else BUSY_WAIT_CORES
    else:
        workers = layout.tp * layout.pp if layout.tp * layout.pp > 1 else 0
        engine = BUSY_WAIT_CORES + workers
    demand = per_node * (engine + api + router + page)
    load_share = demand / layout.cores_per_node
    return max(1.0, load_share) * (1.0 + HOST_LOAD * min(1.0, load_share))


def _shared_gpu(layout: Layout, width_share: float) -> SharedGpu:
    """The engines on one GPU: time-sliced, another's busy time is in one's way whole; under MPS their kernels
    run beside its own, and a small model's kernels fill only ``width_share`` of the GPU."""
    per_gpu = layout.engines_per_gpu if layout.device == "cuda" else 1
    return SharedGpu(per_gpu, MPS_WEIGHT if layout.gpu_sharing == "mps" else 1.0, width_share)


def _gpu_share(layout: Layout, load: Load, runs: list[tuple[EngineRun, float]], width_share: float) -> float:
    """How much the other engines on a GPU slow one engine's device time, at the busiest's mean; 1 where the
    engines were simulated together, each step slowed by what the others ran then."""
    if layout.device != "cuda" or layout.engines_per_gpu < 2 or _in_turn(layout, load):
        return 1.0
    groups = max(1, layout.engines // layout.engines_per_gpu)
    sharing = min(layout.engines_per_gpu, math.ceil(min(load.users, layout.engines) / groups))
    if sharing < 2:
        return 1.0
    busy = max(r.device_alone_s / r.makespan for r, _ in runs)
    return _shared_gpu(layout, width_share).slowing(busy, (sharing - 1) * busy)


def _outcome(runs: list[tuple[EngineRun, float]], layout: Layout, host: float, device: float) -> _Outcome:
    ttft: list[float] = []
    tpot: list[float] = []
    queue: list[float] = []
    causes: dict[str, float] = {}
    tokens_s = 0.0
    for run, count in runs:
        copies = max(1, round(count))
        ttft += run.ttft * copies
        tpot += run.tpot * copies
        queue += run.queue * copies
        tokens_s += count * run.tokens / run.makespan
        for k, v in run.causes.items():
            causes[k] = causes.get(k, 0.0) + v * count
    return _Outcome(ttft, tpot, queue, tokens_s, causes, host, device, host > 1 + HOST_LOAD + OVERSUBSCRIBED)


def _figures(out: _Outcome) -> dict[str, float]:
    tpot = percentile(out.tpot, 50)
    return {
        "ttft_p50_ms": percentile(out.ttft, 50) * 1e3,
        "ttft_p99_ms": percentile(out.ttft, 99) * 1e3,
        "tpot_p50_ms": tpot * 1e3,
        "output_tokens_per_s": out.tokens_per_s,
        "per_user_tokens_per_s": 1.0 / tpot if tpot > 0 else 0.0,
    }


def _rounded(x: float) -> float:
    return round(x, 2) if x < 100 else round(x, 1) if x < 10_000 else round(x)


def predict_point(layout: Layout, model: ModelSpec, load: Load, costs: HostCosts) -> Prediction:
    """The point alone (each band the point): a third of the work, for ranking many plans (``tune``)."""
    return predict(layout, model, load, costs, band=False)


def predict(layout: Layout, model: ModelSpec, load: Load, costs: HostCosts, *, band: bool = True) -> Prediction:
    """The prediction for ``layout`` (``layout_of(plan, hardware)`` or ``vllm_defaults``) under ``load``."""
    point = _run(layout, model, load, costs)
    spread = BAND[costs.kind]
    assumed = layout.device == "cuda" and not (
        layout.gpu and layout.gpu.memory_bandwidth_gbs and layout.gpu.bf16_tflops
    )
    dev = ASSUMED_DEVICE_BAND if assumed else spread
    ends = [
        _run(layout, model, load, costs.scaled(f, g), settled=(point.host, point.device))
        for f, g in ((1 + spread, 1 + dev), (1 / (1 + spread), 1 / (1 + dev)))
        if band
    ]
    figures = _figures(point)
    others = [_figures(e) for e in ends]
    shaped = {
        key: Figure(
            point=_rounded(value),
            low=_rounded(min([value, *(o[key] for o in others)])),
            high=_rounded(max([value, *(o[key] for o in others)])),
        )
        for key, value in figures.items()
    }
    total = sum(point.causes.values()) or 1.0
    shares = {k: round(v / total, 3) for k, v in sorted(point.causes.items(), key=lambda kv: -kv[1]) if v > 0}
    bound = next(iter(shares), "host_step")
    if point.oversubscribed:
        bound = "cores"
    notes = []
    if assumed:
        notes.append(
            "the GPU's bandwidth and FLOP/s are not known here (a profile's memory_bandwidth_gbs and "
            "bf16_tflops give them): a mid-range GPU's were assumed, and the band is wider"
        )
    return Prediction(
        layout=layout.label,
        users=load.users,
        prompt_tokens=list(load.prompt_tokens),
        reply_tokens=load.reply_tokens,
        path=load.path,
        queue_ms=round(sum(point.queue) / max(len(point.queue), 1) * 1e3, 2),
        bound=bound,
        bound_text=BOUNDS[bound],
        shares=shares,
        host_contention=round(point.host, 2),
        gpu_contention=round(point.device, 2),
        costs=costs.source,
        notes=notes,
        **shaped,
    )


def simulate_load(layout: Layout, model: ModelSpec, load: Load, costs: HostCosts) -> dict[str, float]:
    """The point prediction's raw means in seconds (what a calibration fits to): TTFT, TPOT p50 and mean; and
    the host's slowing the load settled at."""
    out = _run(layout, model, load, costs)
    n = max(len(out.tpot), 1)
    return {
        "ttft_s": sum(out.ttft) / max(len(out.ttft), 1),
        "tpot_s": percentile(out.tpot, 50),
        "tpot_mean_s": sum(out.tpot) / n,
        "host": out.host,
    }


def decode_step_s(
    layout: Layout,
    model: ModelSpec,
    costs: HostCosts,
    sequences: int,
    context: float,
    host: float = 1.0,
    *,
    sampled: bool = True,
) -> float:
    """One step of ``sequences`` decoding, ``context`` tokens each, the host's costs slowed by ``host``, their
    tokens drawn at random or greedily: how far apart a reply's tokens come while no prompt is read beside them
    (what a calibration fits to)."""
    costs = costs.front_end(layout.rust_frontend).drawing(sampled)
    step = StepModel(layout, costs, ShapeCosts.of(model, layout.tp, layout.dtype_bytes))
    step.host = host
    return step.time(sequences, sequences * context, [], sequences).duration
