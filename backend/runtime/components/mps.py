"""NVIDIA's Multi-Process Service for engines that share a GPU (the plan's ``gpu_sharing=mps``).

Two processes on one GPU are time-sliced by the driver: while one runs kernels the other's wait.
Under MPS both processes' kernels run on the GPU at once: the plan's two engines on one H200 gave
1.12-1.21x the time-sliced pair's tokens/s at 16-256 concurrent (BENCHMARKS.md, "The plan's engines
under MPS"). ``serve`` runs the control daemon as
the user, with its own pipe and log directories in the run dir, so no system-wide daemon is
touched and the GPU's compute mode stays as it is; it points the engines at it and quits it
after they stop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from backend.errors import EngineStartError
from config.hardware.detection import MPS_CONTROL as CONTROL

CONTROL_TIMEOUT_S = 30.0


class MpsDaemon:
    """One MPS control daemon of this user's own, for the engines of one ``serve``."""

    def __init__(self, run_dir: Path) -> None:
        self.pipe_dir = run_dir / "mps-pipe"
        self.log_dir = run_dir / "mps-log"
        self.running = False

    @property
    def env(self) -> dict[str, str]:
        """What an engine's environment needs to reach this daemon (CUDA reads both)."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def _control(self, *args: str, command: str | None = None) -> subprocess.CompletedProcess[str]:
        binary = shutil.which(CONTROL)
        if binary is None:
            raise EngineStartError(
                f"gpu_sharing=mps: {CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities); "
                "install them, or plan with --set gpu_sharing=time-slice"
            )
        # The daemon sees every GPU, so an engine's CUDA_VISIBLE_DEVICES (host indexes) means the same
        # GPUs through it as without it.
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | self.env
        try:
            return subprocess.run(
                [binary, *args], input=command, env=env, capture_output=True, text=True, timeout=CONTROL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            what = " ".join(args) or (command or "").strip()
            raise EngineStartError(
                f"gpu_sharing=mps: {CONTROL} {what} did not answer within {CONTROL_TIMEOUT_S:.0f} s; "
                f"see {self.log_dir / 'control.log'}, or plan with --set gpu_sharing=time-slice"
            ) from None

    def start(self) -> None:
        """Start the daemon (quitting one a killed ``serve`` left at the same pipe first)."""
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if (self.pipe_dir / "control").exists():
            self._control(command="quit\n")
        done = self._control("-d")
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            raise EngineStartError(
                f"gpu_sharing=mps: {CONTROL} -d failed (code {done.returncode}): {said or 'no output'}; "
                f"see {self.log_dir / 'control.log'}, or plan with --set gpu_sharing=time-slice"
            )
        self.running = True

    def stop(self) -> None:
        """Quit the daemon (after the engines, its clients, have stopped)."""
        if not self.running:
            return
        self.running = False
        with contextlib.suppress(EngineStartError):
            self._control(command="quit\n")
