"""Settings -> (hardware, model shape, plan with commands): the one path every command takes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from config.commands import build_commands, plan_ports
from config.errors import PlanError
from config.hardware import Hardware, resolve_hardware
from config.known_models import known_config
from config.model import ModelReadError, ModelSpec, model_from_config, read_model
from config.plan import Plan
from config.planner import make_plan
from config.settings import Settings
from config.tuned import plan_with_tuned


@dataclass
class Planned:
    hardware: Hardware
    model: ModelSpec
    plan: Plan
    notes: list[str] = field(default_factory=list)
    """Things the user must know about how the plan was made (a bundled config, a demo model)."""


def read_model_shape(model_id: str, revision: str | None = None) -> tuple[ModelSpec, list[str]]:
    """The model's shape from a directory, the HF cache or hub, else a bundled known config."""
    try:
        return read_model(model_id, revision=revision), []
    except ModelReadError as err:
        bundled = known_config(model_id)
        if bundled is None:
            raise
        note = f"planned from the bundled config.json of {model_id} ({err})"
        return model_from_config(bundled, source=model_id), [note]


def planned_as_given(settings: Settings, plan: Plan, model_path: str | Path) -> Planned:
    """Another node's plan (the head's, sent at join) with this node's hardware and model shape."""
    hardware = resolve_hardware(settings.engine.hardware)
    model, notes = read_model_shape(str(model_path), settings.model.revision)
    return Planned(hardware=hardware, model=model, plan=plan, notes=notes)


def plan_for(
    settings: Settings,
    model_path: str | Path | None = None,
    *,
    hardware: Hardware | None = None,
    finish: Callable[[Plan], Plan] | None = None,
) -> Planned:
    """Plan for the settings. ``model_path``: a resolved local checkpoint to read and serve.
    ``hardware``: what to plan for instead of ``engine.hardware`` (a setup's half of the machine,
    ``config.compare``); ``finish``: a last change to the plan before its ports and commands."""
    hardware = hardware or resolve_hardware(settings.engine.hardware)
    source = str(model_path) if model_path else settings.model.id
    model, notes = read_model_shape(source, settings.model.revision)
    served = settings.model.served_name or settings.model.id
    # A tuned profile from `tune` (<run_dir>/tuned/) goes under the user's own pins.
    plan = plan_with_tuned(
        lambda pins: make_plan(hardware, model, settings.workload, pins, served_name=served),
        settings.engine.run_dir,
        hardware.name,
        settings.model.id,
        settings.workload.objective,
        settings.engine.pins,
        notes,
    )
    if finish is not None:
        plan = finish(plan)
    ports = plan_ports(plan, settings.engine.port)
    if ports[-1] > 65535:
        raise PlanError(
            f"engine.port {ports[0]}: the plan's {plan.engine_count} engines and the router's metrics listen on the "
            f"{len(ports) - 1} ports after it, past 65535; choose --engine-port {65535 - len(ports) + 1} or lower"
        )
    served_from = str(Path(source).parent) if Path(source).is_file() else source  # a config.json given: its dir
    plan.commands = build_commands(
        plan,
        python=settings.engine.python,
        model_path=served_from,
        host=settings.engine.host,
        port=settings.engine.port,
        api_key=settings.engine.api_key,
        all_gpus=hardware.gpus_per_node,
        cores=hardware.node.cpu_cores,
        extra_args=settings.engine.extra_args,
    )
    return Planned(hardware=hardware, model=model, plan=plan, notes=notes)
