"""Turn (hardware, model, workload) into vLLM launch parameters, each with its reason.

This module only walks the rules in ``config.rules`` (one family per module: parallel sizes,
memory, batching, dtype, front end, and the CPU and GPU paths' steps), in the order
``config.rules.order`` lists for the device kind, on a draft, then freezes the draft into a
``Plan``, whose own validator checks the cross-field rules.

Where the rules come from:
- vLLM's own (``config.rules.parallel``): heads, KV heads and MLP widths divisible by tp, ...
- docs/article.md: ``max_num_seqs`` is per engine (per replica), not per GPU; ERNIE-4.5-0.3B is
  dense (18 KiB of KV per token).
- Measured (BENCHMARKS.md, one section per rule, cited in each rule's reason): replicas rather than
  TP for small models, several engines per big GPU, whole-step CUDA graphs, prefill chunks of 8192
  on big GPUs, more API servers on hosts with cores to spare.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from config.draft import PINNED_BY_YOU, Draft, Work
from config.errors import PlanError
from config.hardware import Hardware
from config.model import ModelSpec
from config.plan import PINNABLE, Memory, Plan, plan_error
from config.rules.cpu import CpuWork
from config.rules.gpu import GpuWork
from config.rules.order import CPU_STEPS, GPU_STEPS
from config.settings import WorkloadSettings

__all__ = ["PlanError", "coerce_pins", "make_plan"]


def make_plan(
    hardware: Hardware,
    model: ModelSpec,
    workload: WorkloadSettings,
    pins: dict[str, Any] | None = None,
    served_name: str | None = None,
) -> Plan:
    """The plan, or PlanError naming the broken rule and the valid alternatives."""
    one_request = workload.prompt_tokens + workload.reply_tokens
    if one_request > model.max_context:
        raise PlanError(
            f"workload.prompt_tokens + reply_tokens = {workload.prompt_tokens:,} + {workload.reply_tokens:,}: more "
            f"than the model's context of {model.max_context:,} tokens; a typical request must fit in one"
        )
    draft, memory = _draft(hardware, model, workload, coerce_pins(pins or {}))
    _explain_pins(draft, hardware, model, workload)
    try:
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
            reasons=dict(draft.reasons),
            warnings=draft.warnings,
            pinned=sorted(draft.pins),
            **draft.values,
        )
    except ValidationError as err:  # the Plan's cross-field rules, in the planner's own words
        raise plan_error(err) from None


def _draft(
    hardware: Hardware, model: ModelSpec, workload: WorkloadSettings, pins: dict[str, Any]
) -> tuple[Draft, Memory]:
    draft = Draft(pins=pins)
    if hardware.has_gpu:
        return draft, _walk(GpuWork(draft, hardware, model, workload), GPU_STEPS)
    return draft, _walk(CpuWork(draft, hardware, model, workload), CPU_STEPS)


W = TypeVar("W", bound=Work)


def _walk(work: W, steps: tuple[Callable[[W], None], ...]) -> Memory:
    """Run ``steps`` in their listed order on ``work``; the memory arithmetic the last one leaves."""
    for step in steps:
        step(work)
    return work.memory


def _explain_pins(draft: Draft, hardware: Hardware, model: ModelSpec, workload: WorkloadSettings) -> None:
    """Restate each pin's reason as the planner's pick without that pin (the others kept): a rule
    that reads a pin before it sets the value (TP, the context, the prefill chunk) would otherwise
    report the pin as its own pick."""
    for key in draft.pins:
        others = {k: v for k, v in draft.pins.items() if k != key}
        try:
            free, _ = _draft(hardware, model, workload, others)
        except PlanError as err:
            draft.reasons[key] = f"{PINNED_BY_YOU} (without it there is no plan: {err})"
            continue
        if key in free.values:
            draft.reasons[key] = f"{PINNED_BY_YOU} (planner would pick {free.values[key]}: {free.reasons[key]})"


def coerce_pins(pins: dict[str, Any]) -> dict[str, Any]:
    """Pins arrive as strings from ``--set``; type them by the Plan's own fields."""
    out: dict[str, Any] = {}
    for key, raw in pins.items():
        if key not in PINNABLE:
            raise PlanError(f"cannot pin '{key}': pinnable keys are {', '.join(PINNABLE)}")
        field = Plan.model_fields[key]
        assert field.annotation is not None
        try:  # the field's bounds (ge/le) too, so an out-of-range pin is a PlanError, not a crash
            # Annotated[...] built at runtime from the field: a type form mypy cannot read statically
            typed: Any = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
            value = TypeAdapter(typed).validate_python(raw, strict=False)
        except ValidationError as err:
            raise PlanError(f"{key}={raw}: {err.errors()[0]['msg']}") from None
        out[key] = value
    return out
