"""GPU readings for ``verify`` through NVML; every reader takes the ``pynvml`` module as an argument."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from backend.measure.verify.checks import GPUReading, LinkReading
from config.hardware import visible_indexes
from config.hardware.nvml import device_handles, load_nvml, p2p_nvlinked, pcie_link
from config.plan import Plan

SAMPLE_INTERVAL_S = 0.05


def read_gpu(nvml: Any, handle: Any, index: int) -> GPUReading:
    """Compute processes and used memory of one GPU."""
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return GPUReading(index, sorted({int(p.pid) for p in procs}), int(memory.used), int(memory.total))


def gpu_handles(nvml: Any, cuda_indexes: Sequence[int], cuda_visible_devices: str | None) -> dict[int, Any]:
    """Plan (CUDA) index -> NVML handle, honouring ``CUDA_VISIBLE_DEVICES`` as detection does."""
    handles, uuids = device_handles(nvml)
    visible = visible_indexes(cuda_visible_devices, uuids)
    missing = [i for i in cuda_indexes if i >= len(visible)]
    if missing:
        raise LookupError(f"the plan's GPU(s) {missing} are not visible here ({len(visible)} visible)")
    return {i: handles[visible[i]] for i in cuda_indexes}


def read_link(nvml: Any, handle: Any, index: int, peers: Sequence[int], handles: dict[int, Any]) -> LinkReading:
    """PCIe figures and NVLink peers (among ``peers``) of one GPU."""
    linked = [p for p in peers if p != index and p2p_nvlinked(nvml, handle, handles[p])]
    link = pcie_link(nvml, handle)
    return LinkReading(
        index=index,
        pcie_gen=link.gen,
        pcie_width=link.width,
        pcie_gen_max=link.gen_max,
        pcie_width_max=link.width_max,
        nvlink_peers=linked,
    )


class Sampler:
    """Polls GPU-Util and the PCIe link (max seen) in a thread, only while a phase is marked.

    ``util[phase][gpu]`` holds the samples of each phase ('prompts': one at a time; 'load':
    all at once), so idle gaps between requests never count.
    """

    def __init__(self, nvml: Any, handles: dict[int, Any], interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.nvml = nvml
        self.handles = handles
        self.interval_s = interval_s
        self.phase: str | None = None
        self.util: dict[str, dict[int, list[float]]] = {}
        self.pcie: dict[int, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        self.phase = phase
        try:
            yield
        finally:
            self.phase = None

    def samples(self, phase: str) -> dict[int, list[float]]:
        return self.util.get(phase, {i: [] for i in self.handles})

    def _run(self) -> None:
        nv = self.nvml
        while not self._stop.wait(self.interval_s):
            phase = self.phase
            if phase is None:
                continue
            per_gpu = self.util.setdefault(phase, {i: [] for i in self.handles})
            for i, h in self.handles.items():
                with suppress(nv.NVMLError):
                    per_gpu[i].append(float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
                with suppress(nv.NVMLError):
                    gen, width = nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetCurrPcieLinkWidth(h)
                    seen = self.pcie.get(i, (0, 0))
                    self.pcie[i] = (max(seen[0], int(gen)), max(seen[1], int(width)))


@contextmanager
def sampled(sampler: Sampler | None, phase: str) -> Iterator[None]:
    """The sampler's ``phase`` while the block runs; nothing without a sampler (a CPU plan)."""
    if sampler is None:
        yield
    else:
        with sampler.during(phase):
            yield


def open_gpus(plan: Plan, nvml: Any | None) -> tuple[Any | None, dict[int, Any], str]:
    """(pynvml, plan index -> handle, '') for a GPU plan here, else (…, {}, why the GPU checks skip)."""
    if plan.device != "cuda":
        return None, {}, "CPU engine: no GPUs"
    if nvml is None:
        nvml, why = load_nvml()
        if nvml is None:
            return None, {}, why
    try:
        return nvml, gpu_handles(nvml, plan.gpus, os.environ.get("CUDA_VISIBLE_DEVICES")), ""
    except (LookupError, nvml.NVMLError) as err:
        return nvml, {}, f"cannot reach the plan's GPUs: {err}"
