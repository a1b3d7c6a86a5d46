"""Which plans ``tune`` measures: every split and batch size the planner accepts, in an order.

Candidates come from the planner's own rules: every parallel split (TP x PP x replicas) that
uses the GPUs the default uses, crossed with max_num_seqs (the planner's value for that split,
half, double) and max_num_batched_tokens (the planner's, double), and on a GPU async
scheduling (on or off), engines per GPU (one or two behind the router, three under MPS), API servers per engine (half,
double), the stream interval (1 or 16) and CUDA graphs (whole steps or vLLM's own): the knobs that
moved tokens/s on one H200.
``make_plan`` with those pins decides which are valid. The planner's default plan is always
first. Changes that cannot matter at the target load (max_num_seqs above the concurrency
either way) go last.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from config.hardware import Hardware
from config.model import ModelSpec
from config.plan import Plan
from config.planner import PlanError, coerce_pins, make_plan
from config.settings import WorkloadSettings

TUNED_KEYS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "async_scheduling",
    "engines_per_gpu",
    "gpu_sharing",
    "stream_interval",
    "api_server_count",
    "rust_frontend",
    "cudagraph_mode",
    "max_cudagraph_capture_size",
)
SPLIT_KEYS = TUNED_KEYS[:3]
PYTHON_SERVER_KEYS = frozenset({"api_server_count", "stream_interval"})
"""Knobs of Python API servers only: never crossed with vLLM's Rust frontend, which refuses both."""

# Which single change to try first, per objective (after other parallel splits).
_LATER = ("async", "graphs", "sharing", "stream", "api /2")
CHANGE_ORDER = {
    "throughput": ("split", "engines", "frontend", "api x2", "seqs x2", "batch x2", *_LATER, "seqs /2"),
    "balanced": ("split", "engines", "frontend", "api x2", "seqs x2", "seqs /2", "batch x2", *_LATER),
    "latency": ("split", "seqs /2", "frontend", "engines", "api x2", "batch x2", *_LATER, "seqs x2"),
}
Knob = tuple[str, tuple[tuple[Any, str, str], ...]]
"""A plan key and its alternatives to the split's own value: (value, change name, label)."""


@dataclass
class Candidate:
    """One plan to measure: the pins that make it (beyond the user's own) and the plan they give."""

    name: str
    pins: dict[str, Any]
    """Values that differ from the planner's default; the user's own pins are added at start."""
    plan: Plan
    changes: tuple[str, ...] = ()
    """What differs from the default: 'split', 'seqs /2', 'seqs x2', 'batch x2', 'async', 'engines',
    'frontend', 'api x2', 'api /2', 'stream', 'sharing', 'graphs'."""
    base: dict[str, int] = field(default_factory=dict)
    """The planner's own values for this candidate's split (what 'x2' and '/2' are of)."""

    @property
    def values(self) -> dict[str, Any]:
        return plan_values(self.plan)


def plan_values(plan: Plan) -> dict[str, Any]:
    return {k: getattr(plan, k) for k in (*TUNED_KEYS, "max_model_len")}


def _split_name(tp: int, pp: int, dp: int) -> str:
    return f"TP{tp} PP{pp} DP{dp}"


def parallel_splits(hardware: Hardware, default: Plan) -> list[tuple[int, int, int]]:
    """(TP, PP, replicas) using the GPUs the default plan uses; the default's split first."""
    first = (default.tensor_parallel_size, default.pipeline_parallel_size, default.data_parallel_size)
    if not hardware.has_gpu:
        return [first]
    gpus = len(default.gpus) or hardware.gpus_per_node
    if default.split_across_nodes:  # one engine spans the nodes: no replicas
        total = gpus * default.nodes
        found = [(tp, total // tp, 1) for tp in range(1, gpus + 1) if total % tp == 0]
    else:
        divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
        found = [(t, p, d) for t, p, d in itertools.product(divisors, repeat=3) if t * p * d == gpus]
    return [first] + [s for s in found if s != first]


def enumerate_candidates(
    hardware: Hardware,
    model: ModelSpec,
    workload: WorkloadSettings,
    user_pins: dict[str, Any] | None = None,
    served_name: str | None = None,
) -> tuple[list[Candidate], list[str]]:
    """Every distinct plan the planner accepts, the default first; and why the others were refused.

    Raises PlanError when the user's own pins give no plan (nothing to tune then).
    """
    user = coerce_pins(dict(user_pins or {}))  # '--set' gives strings; compare typed values

    def plan(pins: dict[str, Any]) -> Plan:
        return make_plan(hardware, model, workload, {**pins, **user}, served_name=served_name)

    default = plan({})
    first_split = (default.tensor_parallel_size, default.pipeline_parallel_size, default.data_parallel_size)
    candidates: list[Candidate] = []
    rejected: list[str] = []
    seen: set[tuple[Any, ...]] = set()

    def overruled(pins: dict[str, Any]) -> bool:
        """A value the user pinned otherwise: the user's pin would win, so it is no candidate."""
        return any(key in user and user[key] != value for key, value in pins.items())

    def add(name: str, pins: dict[str, Any], changes: tuple[str, ...], base: dict[str, int], engines: int) -> None:
        if overruled(pins) or (pins.get("rust_frontend") and PYTHON_SERVER_KEYS & pins.keys()):
            return  # the Rust frontend takes neither Python API servers' count nor a stream interval
        try:
            p = plan(pins)
        except PlanError as err:
            rejected.append(f"{name}: {err}")
            return
        if "engines" not in changes and p.engines_per_gpu != engines:
            # the planner's answer to another pin (time-sliced, or vLLM's own graphs: fewer engines share
            # the GPU): named, so that its figures are not put down to that pin alone
            changes, name = (*changes, "engines"), f"{name} + {_engines_label(p.engines_per_gpu)}"
        key = tuple(plan_values(p).values())
        if key in seen:
            return
        seen.add(key)
        candidates.append(Candidate(name=name, pins=pins, plan=p, changes=changes, base=base))

    for split in parallel_splits(hardware, default):
        split_pins = {} if split == first_split else dict(zip(SPLIT_KEYS, split, strict=True))
        if overruled(split_pins):
            continue
        try:
            base_plan = default if not split_pins else plan(split_pins)
        except PlanError as err:
            rejected.append(f"{_split_name(*split)}: {err}")
            continue
        seqs, batch = base_plan.max_num_seqs, base_plan.max_num_batched_tokens
        base = {"max_num_seqs": seqs, "max_num_batched_tokens": batch}
        knobs = _knobs(base_plan, gpu=default.device == "cuda")
        for choice in itertools.product(*[(None, *options) for _, options in knobs]):
            pins = dict(split_pins)
            changes: list[str] = ["split"] if split_pins else []
            parts = [_split_name(*split)] if split_pins else []
            for (key, _), picked in zip(knobs, choice, strict=True):
                if picked is not None:
                    value, change, label = picked
                    pins[key] = value
                    changes.append(change)
                    parts.append(label)
            add(" + ".join(parts) or "default", pins, tuple(changes), base, base_plan.engines_per_gpu)
    return candidates, rejected


def _knobs(base_plan: Plan, *, gpu: bool) -> list[Knob]:
    """What ``tune`` varies around one split's plan. GPU only: async scheduling off (the planner
    turns it on, as vLLM does by itself, and says `tune` measures it off), engines per GPU, whole-step
    CUDA graphs against vLLM's own, MPS against time-slicing, and the front end: vLLM's Rust frontend
    against Python API servers, and for Python ones their count per engine (the planner's, halved and
    doubled: 3 to 4 per engine gave 1.08-1.14x on one H200) and the stream interval (the Rust frontend
    takes neither)."""
    seqs, batch = base_plan.max_num_seqs, base_plan.max_num_batched_tokens
    half = max(1, seqs // 2)
    knobs: list[Knob] = [
        ("max_num_seqs", ((half, "seqs /2", f"seqs {half}"), (seqs * 2, "seqs x2", f"seqs {seqs * 2}"))),
        ("max_num_batched_tokens", ((batch * 2, "batch x2", f"batch {batch * 2}"),)),
    ]
    if gpu:
        if base_plan.async_scheduling:
            knobs.append(("async_scheduling", ((False, "async", "async scheduling off"),)))
        knobs.append(("engines_per_gpu", tuple((n, "engines", _engines_label(n)) for n in _other_engines(base_plan))))
        if base_plan.cudagraph_mode == "FULL":  # vLLM's own graphs (the capture size follows the mode)
            knobs.append(("cudagraph_mode", (("auto", "graphs", "vLLM's own CUDA graphs"),)))
        if base_plan.gpu_sharing == "mps":  # the other way needs MPS on the host, which the plan then had chosen
            knobs.append(("gpu_sharing", (("time-slice", "sharing", "GPU time-sliced, no MPS"),)))
        if base_plan.rust_frontend:
            knobs.append(("rust_frontend", ((False, "frontend", "Python API servers"),)))
            return knobs
        knobs.append(("rust_frontend", ((True, "frontend", "vLLM's Rust frontend"),)))
        api = base_plan.api_server_count
        apis = [(api * 2, "api x2", f"{api * 2} API servers")]
        if api > 1:
            apis.append((api // 2, "api /2", f"{api // 2} API servers"))
        knobs.append(("api_server_count", tuple(apis)))
        interval = 1 if base_plan.stream_interval > 1 else 16
        knobs.append(("stream_interval", ((interval, "stream", f"stream interval {interval}"),)))
    return knobs


def _other_engines(base_plan: Plan) -> list[int]:
    """Engines per GPU to try beside the plan's: two for one or three, one for two; and three first for
    two under MPS with whole-step graphs (the planner's two there is for 64-127 users per GPU, below the
    128 and 256 concurrent where three gave 1.05-1.15x two; BENCHMARKS.md, "Three engines under MPS")."""
    if base_plan.engines_per_gpu in (1, 3):
        return [2]
    if base_plan.engines_per_gpu == 2 and base_plan.gpu_sharing == "mps" and base_plan.cudagraph_mode == "FULL":
        return [3, 1]
    return [1]


def _engines_label(n: int) -> str:
    return f"{n} engine{'s' if n > 1 else ''} per GPU"


def inert_changes(candidate: Candidate, concurrency: int, long_prompt_tokens: int) -> list[str]:
    """The candidate's changes that cannot show at this load.

    max_num_seqs only limits when a replica has more requests than it; max_num_batched_tokens
    only when one step's prompt tokens (requests x longest prompt) exceed it. With replicas,
    one may get all the requests (vLLM's balancer is uneven: on 2 x H200 at 32 concurrent, 16
    per replica queued), so each is assumed to see the whole load.
    """
    per_replica = concurrency  # not concurrency / replicas: see above
    seqs_base = candidate.base.get("max_num_seqs", candidate.plan.max_num_seqs)
    batch_base = candidate.base.get("max_num_batched_tokens", candidate.plan.max_num_batched_tokens)
    idle: list[str] = []
    for change in candidate.changes:
        if change.startswith("seqs") and min(seqs_base, candidate.plan.max_num_seqs) >= per_replica:
            idle.append(change)
        if change.startswith("batch") and min(per_replica, seqs_base) * long_prompt_tokens <= batch_base:
            idle.append(change)
    return idle


def inert(candidate: Candidate, concurrency: int, long_prompt_tokens: int) -> bool:
    """True when the candidate differs from the default, but in nothing that can show at this load."""
    idle = inert_changes(candidate, concurrency, long_prompt_tokens)
    return bool(candidate.changes) and len(idle) == len(candidate.changes)


def order_candidates(
    candidates: Sequence[Candidate],
    k: int,
    objective: str,
    concurrency: int,
    long_prompt_tokens: int,
) -> list[Candidate]:
    """The default, then up to k−1 others: changes that can show at this load first, single
    changes before combinations, in the objective's order (other splits first). Halving
    max_num_seqs below the target load goes near the end unless the objective is latency:
    on one H200 it cost 30 % of tokens/s and doubled p99 TTFT at 32 concurrent."""
    if not candidates:
        return []
    order = CHANGE_ORDER.get(objective, CHANGE_ORDER["balanced"])
    throughput_first = objective != "latency"

    def key(c: Candidate) -> tuple[Any, ...]:
        idle = len(inert_changes(c, concurrency, long_prompt_tokens))
        # Fewer sequences than the target load (a replica may get all of it) only queues
        # requests: last but one, unless for latency.
        queues = throughput_first and "seqs /2" in c.changes and c.plan.max_num_seqs < concurrency
        ranks = tuple(sorted(order.index(ch) for ch in c.changes))
        p = c.plan
        # Replicas before TP before PP for throughput (measured on H200); widest TP for latency.
        split = (
            (-p.data_parallel_size, p.pipeline_parallel_size, p.tensor_parallel_size)
            if throughput_first
            else (-p.tensor_parallel_size, p.pipeline_parallel_size, -p.data_parallel_size)
        )
        return (idle == len(c.changes), queues, idle, len(c.changes), ranks, split)

    default, rest = candidates[0], list(candidates[1:])
    return [default, *sorted(rest, key=key)[: max(0, k - 1)]]
