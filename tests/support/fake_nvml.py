"""A tiny stand-in for pynvml, for the GPU branches this GPU-less machine cannot run for real.

This machine has no GPU, so NVML never initialises here and the GPU branches of detection
cannot run for real. Tests feed read_gpus and the NVML helpers this fake for exactly those
branches; everything else runs on the real machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from config.hardware import GIB


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


@dataclass
class FakeGPU:
    name: str
    bus: str
    links: list[str] = field(default_factory=list)
    """Remote bus ids of active NVLinks; 'off' for a link that exists but is down."""
    pcie: tuple[int, int] | None = (4, 16)
    memory_ok: bool = True


class FakeNVML:
    """Just the pynvml calls read_gpus makes; handles are indexes."""

    NVMLError = FakeNVMLError
    NVML_NVLINK_MAX_LINKS = 6
    NVML_FEATURE_ENABLED = 1
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0

    def __init__(self, gpus: list[FakeGPU], p2p: set[tuple[int, int]] | None = None):
        self.gpus = gpus
        self.p2p = p2p
        self.shut_down = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}{h}{h}{h}-uuid".encode()  # old pynvml returned bytes

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        if not self.gpus[h].memory_ok:
            raise FakeNVMLError("Unknown Error")
        return SimpleNamespace(total=80 * GIB, free=70 * GIB + h, used=10 * GIB)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def _pcie(self, h: int, part: int) -> int:
        pcie = self.gpus[h].pcie
        if pcie is None:
            raise FakeNotSupported("Not Supported")
        return pcie[part]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._pcie(h, 0) - 1  # trained down while idle

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._pcie(h, 1)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._pcie(h, 0)

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._pcie(h, 1)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].bus)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        links = self.gpus[h].links
        if link >= len(links):
            raise FakeNotSupported("Not Supported")
        return 0 if links[link] == "off" else 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].links[link])

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, caps: int) -> int:
        assert caps == self.NVML_P2P_CAPS_INDEX_NVLINK
        if self.p2p is None:
            raise FakeNotSupported("Not Supported")
        return 0 if (min(a, b), max(a, b)) in self.p2p else 4

    def nvmlShutdown(self) -> None:
        self.shut_down = True


def four_gpus() -> FakeNVML:
    """NVML 0<->1 and 2<->3 bridged in pairs; 3 reports no PCIe figures (a vGPU)."""
    b = ["00000000:01:00.0", "00000000:02:00.0", "00000000:03:00.0", "00000000:04:00.0"]
    return FakeNVML(
        [
            FakeGPU("G0", b[0], ["0000:02:00.0", "0000:02:00.0"]),
            FakeGPU("G1", b[1], [b[0], "off"]),
            FakeGPU("G2", b[2], [b[3]]),
            FakeGPU("G3", b[3], [b[2]], pcie=None),
        ]
    )
