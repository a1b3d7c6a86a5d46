"""Calibrated host costs: what a warm-up measured on this machine, used by the next ``plan`` here.

A file lives in ``<engine.run_dir>/calibrated/<key>.json`` (as ``tune``'s profiles live in ``tuned/``);
the key is a slug of the hardware's name and the engine kind, and the file repeats both, so a slug
collision is never taken for a match. The hardware's name is what the planner calls the machine it
plans for ('this machine: CPU only (2 cores, 24 GiB)', or a profile's): never a host name. A plan for
other hardware (``--hardware 1xH100`` on a laptop) finds no file and says it used the defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from config.performance.costs import HostCosts, default_costs
from config.tuned import slug

CALIBRATED_DIR = "calibrated"


def calibrated_path(run_dir: Path, hardware: str, device: str) -> Path:
    return Path(run_dir) / CALIBRATED_DIR / f"{slug(hardware)[:100]}--{device}.json"


def save_calibrated(run_dir: Path, costs: HostCosts, device: str) -> Path:
    """Write the costs for their hardware (atomically: a ``plan`` at the same time never reads half)."""
    path = calibrated_path(run_dir, costs.measured_on, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(costs.model_dump_json(indent=2))
    tmp.replace(path)
    return path


def costs_for(run_dir: Path, hardware: str, device: str) -> tuple[HostCosts, str | None]:
    """This machine's calibrated costs for ``hardware``, else the defaults; and a note when a file was
    there but could not be used."""
    path = calibrated_path(run_dir, hardware, device)
    try:
        costs = HostCosts.model_validate_json(path.read_text())
    except FileNotFoundError:
        return default_costs(device), None
    except (OSError, ValidationError, ValueError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else "not a calibration this version reads"
        return default_costs(device), f"calibrated host costs {path} not used ({why}); delete it or serve again"
    if costs.measured_on != hardware or costs.kind != "calibrated":
        return default_costs(device), None
    return costs, None
