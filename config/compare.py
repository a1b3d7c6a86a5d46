"""Two setups side by side on one machine (``up --compare``): the plan, and beside it either vLLM's own
``vllm serve MODEL`` with its defaults (``defaults``) or the plan with some values pinned
(``KEY=VALUE ...``, as ``--set``; ``objective=`` and the other workload keys too).

Both are planned before anything starts, each for its half of the machine (:func:`half_of`): half of
each GPU's memory share, half the cores (each setup's threads bound to cores of its own) and half the
RAM (so half the CPU KV cache space); then what both take of each GPU together is checked against the
whole. A pair that cannot run at once is refused with the reason and what would fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from config.commands import core_range, engine_flags, plan_ports
from config.errors import PlanError, SettingsError
from config.hardware import Hardware, resolve_hardware
from config.model import ModelSpec
from config.pipeline import Planned, plan_for, read_model_shape
from config.plan import GIB, PINNABLE, Plan
from config.rules.batching import vllm_default_batch
from config.rules.cpu import NO_AOT_COMPILE
from config.settings import Settings, WorkloadSettings, describe_validation_error

DEFAULTS = "defaults"
WORKLOAD_KEYS = ("objective", "users", "prompt_tokens", "reply_tokens", "context")
"""Workload settings a compared setup may take its own value of (they change what the planner picks)."""
PLAN_LABEL = "plan"
DEFAULTS_LABEL = "vllm serve defaults"
COMPARE_DIR = "compare"
"""The compared setup's run directory, inside the plan's (its status, plan, logs and warm-up)."""
MOST_OF_A_GPU = 0.95
"""What the setups may take of one GPU's memory together (as ``engines_per_gpu`` x share)."""
NOT_PASSED = "vLLM's own default (not passed): what `vllm serve MODEL` takes by itself"
Finish = Callable[[Plan], Plan]
"""A plan's last change before its ports and commands (``plan_for``'s ``finish``)."""


@dataclass(frozen=True)
class CompareSpec:
    """What ``--compare`` asked for: vLLM's defaults, or the plan with these values."""

    defaults: bool = False
    pins: dict[str, str] = field(default_factory=dict)
    workload: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How the page, ``status`` and the latency files name the compared setup."""
        if self.defaults:
            return DEFAULTS_LABEL
        return " ".join(f"{k}={v}" for k, v in {**self.workload, **self.pins}.items())


def parse_compare(text: str) -> CompareSpec:
    """``defaults``, or ``KEY=VALUE`` pairs apart by spaces or commas; SettingsError saying what is wrong."""
    words = text.replace(",", " ").split()
    example = 'e.g. --compare defaults or --compare "max_num_seqs=4 objective=latency"'
    if not words:
        raise SettingsError(f"--compare: give 'defaults' or KEY=VALUE values, {example}")
    if words == [DEFAULTS]:
        return CompareSpec(defaults=True)
    pins: dict[str, str] = {}
    workload: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if word == DEFAULTS:
            raise SettingsError(f"--compare {text!r}: 'defaults' stands alone (vLLM's own defaults take no pins)")
        if not sep or not key or not value:
            raise SettingsError(f"--compare {word!r}: expected KEY=VALUE or 'defaults', {example}")
        if key not in PINNABLE and key not in WORKLOAD_KEYS:
            raise SettingsError(
                f"--compare {key}: not a plan value or a workload key; allowed: "
                + ", ".join((*PINNABLE, *WORKLOAD_KEYS))
            )
        target = workload if key in WORKLOAD_KEYS else pins
        if target.get(key, value) != value:
            raise SettingsError(f"--compare {key} given twice ({target[key]} and {value}): keep the one you mean")
        target[key] = value
    return CompareSpec(pins=pins, workload=workload)


@dataclass
class Pair:
    """The two setups, planned for their halves of one machine, ready to start one after the other."""

    first: Planned
    second: Planned
    second_settings: Settings
    """The compared setup's own settings: its engine port, run directory, pins and workload."""
    label: str
    notes: list[str] = field(default_factory=list)


def half_of(hardware: Hardware) -> Hardware:
    """What one of two setups may plan for: half of each GPU's memory share, half the cores, half the RAM."""
    node = hardware.node
    if hardware.nodes > 1:
        raise PlanError(
            f"--compare runs both setups on this one machine, and {hardware.name} has {hardware.nodes} nodes; "
            "compare on one node (--hardware with nodes = 1)"
        )
    if node.cpu_cores < 2:
        raise PlanError("--compare: each setup needs cores of its own, and this machine has 1; valid: 2 or more cores")
    view = node.model_copy(update={"cpu_cores": node.cpu_cores // 2, "memory_bytes": node.memory_bytes // 2})
    return hardware.model_copy(update={"name": f"half of {hardware.name}", "node": view, "share": hardware.share / 2})


def plan_pair(settings: Settings, spec: CompareSpec, model_path: str | Path) -> Pair:
    """Both setups, or PlanError naming the one that cannot run beside the other, why, and what would fit."""
    hardware = resolve_hardware(settings.engine.hardware)
    half = half_of(hardware)
    cores, ram = half.node.cpu_cores, half.node.memory_bytes / GIB
    each = f"{cores} of its {hardware.node.cpu_cores} cores, {ram:.1f} GiB of RAM" + (
        f", {half.share:.0%} of each GPU's memory share" if hardware.has_gpu else ""
    )
    mine, theirs = core_range(0, cores), core_range(cores, cores)

    def planned(what: str, plan: Callable[[], Planned]) -> Planned:
        try:
            return plan()
        except PlanError as err:
            where = f"on {hardware.name}, each on half ({each})"
            raise PlanError(f"{what} cannot run beside the other {where}: {err}") from None

    first = planned("the plan", lambda: plan_for(settings, model_path, hardware=half, finish=bind(mine, theirs)))
    port = plan_ports(first.plan, settings.engine.port)[-1] + 1
    other = compared_settings(settings, spec, port, model_path, half)
    finish = as_defaults(theirs, mine) if spec.defaults else bind(theirs, mine)
    second = planned(
        f"the compared setup ({spec.label})", lambda: plan_for(other, model_path, hardware=half, finish=finish)
    )
    check_together(first.plan, second.plan, spec.label)
    notes = [
        f"--compare: the plan and {spec.label} each run on half of {hardware.name} ({each}), one after the other "
        "on each message"
    ]
    if not spec.defaults and same_setup(first.plan, second.plan):
        notes.append(
            f"the compared setup ({spec.label}) runs what the plan runs: the two differ only in their cores and "
            "ports, so the comparison shows how far two like setups differ by chance"
        )
    return Pair(first, second, other, spec.label, notes)


def compared_settings(
    settings: Settings, spec: CompareSpec, port: int, model_path: str | Path, half: Hardware
) -> Settings:
    """The compared setup's settings: the port after the plan's last, a run directory inside the plan's,
    the plan's pins with the compared ones over them (vLLM's defaults: only what describes them)."""
    try:
        workload = WorkloadSettings.model_validate({**settings.workload.model_dump(), **spec.workload})
    except ValidationError as err:
        raise SettingsError(f"--compare: {describe_validation_error(err)}") from None
    if spec.defaults:
        model, _ = read_model_shape(str(model_path), settings.model.revision)
        pins = defaults_pins(half, model)
    else:
        pins = {**settings.engine.pins, **spec.pins}
    engine = settings.engine.model_copy(
        update={"port": port, "run_dir": Path(settings.engine.run_dir) / COMPARE_DIR, "pins": pins}
    )
    return settings.model_copy(update={"engine": engine, "workload": workload})


def defaults_pins(hardware: Hardware, model: ModelSpec) -> dict[str, Any]:
    """The values ``vllm serve MODEL`` takes by itself, as pins, so that the planner sizes its memory and
    refuses where they cannot fit (the model's whole context in its half of the KV cache)."""
    seqs, batched = vllm_default_batch(hardware)
    pins: dict[str, Any] = {
        "max_model_len": model.max_context,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": batched,
        "engines_per_gpu": 1,
        "api_server_count": 1,
        "stream_interval": 1,
    }
    if hardware.has_gpu:
        pins |= {
            "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1,
            "data_parallel_size": 1,
            "async_scheduling": True,
            "cudagraph_mode": "auto",
            "max_cudagraph_capture_size": 0,
            "rust_frontend": False,  # vLLM's Python API server unless VLLM_USE_RUST_FRONTEND is set
        }
    return pins


def bind(cores: str, other: str) -> Finish:
    """The plan's last change on a CPU: its threads on its own cores, the other setup's on the others."""

    def finish(plan: Plan) -> Plan:
        if plan.device != "cpu":
            return plan
        env = {**plan.environment, "VLLM_CPU_OMP_THREADS_BIND": cores}
        why = (
            f"one bound OpenMP thread on each of cores {cores}, this setup's half of the machine (the setup compared "
            f"beside it runs on cores {other}); {NO_AOT_COMPILE}"
        )
        return changed(plan, environment=env, reasons={**plan.reasons, "environment": why})

    return finish


def as_defaults(cores: str, other: str) -> Finish:
    """The last change that makes a plan of vLLM's defaults ``vllm serve MODEL``: nothing passed but its
    share of the machine and the page's reply metrics, every value said to be vLLM's own."""

    def finish(plan: Plan) -> Plan:
        reasons = dict.fromkeys(plan.reasons, NOT_PASSED)
        if plan.device == "cuda":
            reasons["gpu_memory_utilization"] = (
                "passed: half of vLLM's own 0.9 of the GPU, the plan beside it takes the other half"
            )
            env: dict[str, str] = {}
        else:
            reasons["cpu_kv_cache_space_gib"] = (
                "passed (--kv-cache-memory-bytes): the CPU KV cache the planner sizes for its half of the RAM; vLLM's "
                "own takes 0.9 of all of it"
            )
            env = {"VLLM_CPU_OMP_THREADS_BIND": cores}
            reasons["environment"] = f"its threads on cores {cores}, the plan's on cores {other}; nothing else set"
        for key in ("per_request_metrics", "prompt_tokens_details"):
            if getattr(plan, key):
                reasons[key] = "passed: the page's footer reads it; it changes nothing in how vLLM schedules"
        reasons["page_processes"] = "the page is the plan's, shared by both setups"
        gpus = plan.gpus[:1]
        return changed(
            plan, vllm_defaults=True, environment=env, reasons=reasons, pinned=[], engine_core_nice=0, gpus=gpus
        )

    return finish


def changed(plan: Plan, **update: Any) -> Plan:
    """``plan`` with ``update``, checked again as any plan is."""
    return Plan.model_validate({**plan.model_dump(), **update})


def check_together(first: Plan, second: Plan, label: str) -> None:
    """PlanError where the two setups take more than :data:`MOST_OF_A_GPU` of a GPU's memory together
    (a pinned ``gpu_memory_utilization`` sets both); each one's cores and RAM were its half already."""
    if first.device != "cuda":
        return
    for gpu in sorted(set(first.gpus) | set(second.gpus)):
        taken = [(p.gpu_memory_utilization or 0) * p.engines_per_gpu for p in (first, second) if gpu in p.gpus]
        if sum(taken) > MOST_OF_A_GPU:
            fits = round(MOST_OF_A_GPU / 2 / max(first.engines_per_gpu, second.engines_per_gpu), 2)
            raise PlanError(
                f"the plan and the compared setup ({label}) take {' + '.join(f'{t:.2f}' for t in taken)} = "
                f"{sum(taken):.2f} of GPU {gpu}'s memory together, more than {MOST_OF_A_GPU}; would fit: "
                f"gpu_memory_utilization={fits} or less for each (--set and --compare), or no pin of it"
            )


def same_setup(first: Plan, second: Plan) -> bool:
    """Whether the two setups start the same vLLM (their cores and ports apart)."""
    env = [{k: v for k, v in p.environment.items() if k != "VLLM_CPU_OMP_THREADS_BIND"} for p in (first, second)]
    return engine_flags(first) == engine_flags(second) and env[0] == env[1] and first.routed == second.routed
