"""Human-readable plan: values with reasons, the memory arithmetic, the exact commands."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from config.commands import node_parts
from config.performance.forecast import Forecast
from config.performance.text import forecast_lines
from config.plan import SHOWN

if TYPE_CHECKING:
    from config.pipeline import Planned


def plan_lines(planned: Planned, width: int = 100, expected: Forecast | None = None) -> list[str]:
    plan, model, hw = planned.plan, planned.model, planned.hardware
    lines = [
        f"hardware:  {hw.name}  [{hw.source}]",
        f"model:     {model.source}  ({model.architecture}, {model.param_count / 1e9:.2f} B params, "
        f"{'MoE' if model.is_moe else 'dense'}, {model.num_layers} layers, {model.num_attention_heads} heads, "
        f"{model.num_kv_heads} KV heads)",
        f"objective: {plan.objective}",
        f"plan:      {plan.summary()}",
        "",
    ]
    for note in planned.notes:
        lines.append(f"note: {note}")
    for key in SHOWN:
        value = getattr(plan, key)
        if value is None:
            continue
        pin = " (pinned)" if key in plan.pinned else ""
        head = f"  {key} = {value}{pin}"
        reason = plan.reasons.get(key, "")
        wrapped = textwrap.wrap(reason, width=width - 8, break_on_hyphens=False) or [""]
        lines.append(head)
        lines.extend(f"      {w}" for w in wrapped)
    if plan.environment:
        lines.append("  environment: " + " ".join(f"{k}={v}" for k, v in sorted(plan.environment.items())))
        env = plan.reasons.get("environment", "")
        lines.extend(f"      {w}" for w in textwrap.wrap(env, width=width - 8, break_on_hyphens=False))
    lines.append("")
    lines.append("memory (per GPU)" if plan.device == "cuda" else "memory (CPU engine)")
    for label, value in plan.memory.table():
        lines.append(f"  {label:40} {value:>16}")
    if expected is not None:
        lines.append("")
        lines.append("expected (the performance model, BENCHMARKS.md#prediction):")
        for line in forecast_lines(expected):
            lines.extend(textwrap.wrap(line, width=width, initial_indent="  ", subsequent_indent="      "))
    if plan.warnings:
        lines.append("")
        lines.extend(f"warning: {w}" for w in plan.warnings)
    parts = node_parts(plan)
    if parts:
        lines.append("")
        lines.append(f"nodes ({plan.nodes}):")
        lines.extend(
            f"      {w}" for w in textwrap.wrap(plan.reasons.get("nodes", ""), width=width - 8, break_on_hyphens=False)
        )
        for part in parts:
            lines.append(f"  node {part.node}{' (head)' if part.node == 0 else ''}: {part.runs}")
            lines.append(f"      start: {part.start}")
    lines.append("")
    lines.append("commands:")
    for cmd in plan.commands:
        where = "head node" if cmd.node == 0 else f"node {cmd.node}"
        lines.append(f"  # {cmd.role} ({where})" if plan.nodes > 1 else f"  # {cmd.role}")
        lines.append(f"  {cmd.shell()}")
    return lines


def print_plan(planned: Planned, expected: Forecast | None = None) -> None:
    print("\n".join(plan_lines(planned, expected=expected)))
