"""What a run is expected to deliver: the performance model's forecast for its plan, with this host's
costs calibrated from the warm-up it just ran (``config.performance.calibrate``), kept in the status and
in the machine's calibration file (``config.calibrated``) for the next ``plan`` here."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from backend.runtime.status import WarmupRecord
from config.calibrated import costs_for, save_calibrated
from config.performance.calibrate import CalibrationError, calibrate
from config.performance.costs import HostCosts, default_costs
from config.performance.forecast import Forecast, forecast
from config.performance.layout import layout_of
from config.pipeline import Planned
from config.settings import Settings


def planned_forecast(settings: Settings, planned: Planned, costs: HostCosts | None = None) -> Forecast:
    """The plan at the settings' load (users, prompt and reply tokens) and at one user; ``costs``: this
    machine's calibrated costs for the hardware where there are some, else the defaults."""
    plan, hardware = planned.plan, planned.hardware
    if costs is None:
        costs, _ = costs_for(settings.engine.run_dir, hardware.name, plan.device)
    w = settings.workload
    return forecast(
        plan,
        hardware,
        planned.model,
        costs,
        users=w.users,
        prompt_tokens=w.prompt_tokens,
        reply_tokens=w.reply_tokens,
        sampled=settings.app.sampling().draws,
    )


def calibrated(settings: Settings, planned: Planned, record: WarmupRecord) -> tuple[HostCosts | None, str]:
    """This host's costs fitted to ``record`` and saved for the next ``plan`` here; None and why not when
    the warm-up measured too little (it was off)."""
    plan, hardware = planned.plan, planned.hardware
    if record.disabled or not record.samples:
        return None, "host costs not calibrated: the warm-up was off"
    layout = layout_of(plan, hardware)
    warmed = replace(layout, engines=1) if plan.routed else layout  # each engine is warmed on its own
    try:
        costs = calibrate(
            warmed,
            planned.model,
            record.samples,
            default_costs(plan.device),
            measured_on=hardware.name,
            measured_at=datetime.now(UTC).date().isoformat(),
        )
    except CalibrationError as err:
        return None, f"host costs not calibrated: {err}"
    path = save_calibrated(settings.engine.run_dir, costs, plan.device)
    return costs, f"host costs calibrated from the warm-up, kept in {path} for the next plan on this machine"


def expected_after_warmup(settings: Settings, planned: Planned, record: WarmupRecord) -> tuple[Forecast, str]:
    """The run's forecast once warmed: with the costs its warm-up calibrated, else the ones ``plan`` used;
    and a line saying which."""
    costs, note = calibrated(settings, planned, record)
    return planned_forecast(settings, planned, costs), note
