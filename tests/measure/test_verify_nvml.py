"""``verify``'s NVML readers and sampler, against a fake pynvml (this machine has no GPU)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest

from backend.measure.verify.checks import (
    GPUReading,
    LinkReading,
    check_link,
)
from backend.measure.verify.nvml import Sampler, gpu_handles, read_gpu, read_link
from config.hardware import GIB

if TYPE_CHECKING:
    pass


# ============================================================================ NVML readers
# A fake pynvml: these paths need a GPU, which this machine has not. It answers only the
# calls the readers make, with the types real pynvml returns.


class FakeNVML:
    NVMLError = RuntimeError
    NVML_P2P_CAPS_INDEX_NVLINK = 3
    NVML_P2P_STATUS_OK = 0

    def __init__(self, uuids: list[str], nvlinked: set[tuple[int, int]]) -> None:
        self.uuids = uuids
        self.nvlinked = nvlinked

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return self.uuids[h].encode()  # old pynvml releases return bytes

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=1000 + h, usedGpuMemory=None)]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(100 + h) * GIB, total=141 * GIB, free=(41 - h) * GIB)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 8 if h == 3 else 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=70 + h, memory=5)

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, caps: int) -> int:
        return 0 if (min(a, b), max(a, b)) in self.nvlinked else 4


def test_readers_follow_cuda_visible_devices() -> None:
    nvml = FakeNVML(["GPU-a", "GPU-b", "GPU-c", "GPU-d"], nvlinked={(2, 3)})
    handles = gpu_handles(nvml, [0, 1], "2,3")  # the plan's GPUs 0, 1 are NVML's 2, 3
    assert handles == {0: 2, 1: 3}
    assert read_gpu(nvml, handles[1], 1) == GPUReading(1, [1003], 103 * GIB, 141 * GIB)
    link = read_link(nvml, handles[1], 1, [0, 1], handles)
    assert link == LinkReading(1, 5, 8, None, 16, [0])
    assert check_link(link, [0]).result == "warn"
    with pytest.raises(LookupError):
        gpu_handles(nvml, [0, 1], "1")


def test_sampler_keeps_phases_apart() -> None:
    nvml = FakeNVML(["GPU-a", "GPU-b"], nvlinked=set())
    with Sampler(nvml, {0: 0, 1: 1}, interval_s=0.01) as sampler:
        time.sleep(0.1)  # no phase: nothing sampled
        with sampler.during("load"):  # until a whole sample is in: a busy machine only delays it
            deadline = time.monotonic() + 60
            while len(sampler.pcie) < 2:
                assert time.monotonic() < deadline, "the sampler thread took no sample in 60 s"
                time.sleep(0.01)
    assert sampler.samples("prompts") == {0: [], 1: []}
    load = sampler.samples("load")
    assert load[0] and set(load[0]) == {70.0} and set(load[1]) == {71.0}
    assert sampler.pcie == {0: (5, 16), 1: (5, 16)}
