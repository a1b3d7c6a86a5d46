"""Hardware inventory: shipped and hand-written profiles, their errors, live detection."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from config import hardware
from config.hardware import (
    GIB,
    Hardware,
    HardwareError,
    NodeInfo,
    describe_node,
    detect,
    list_profiles,
    load_profile,
    memory_bytes,
    normalize_bus_id,
    numa_nodes,
    nvlink_pairs_from_remotes,
    parse_cgroup_limit,
    parse_cpu_flags,
    parse_meminfo,
    read_gpus,
    reindex_pairs,
    resolve_hardware,
    visible_indexes,
)

# ----------------------------------------------------------------- shipped profiles


@dataclass(frozen=True)
class Expect:
    nodes: int
    gpus: int
    nvlinked: bool
    gpu_names: tuple[str, ...] = ()
    memory_gib: float | None = None
    capability: tuple[int, int] | None = None
    pcie: tuple[int, int] | None = (4, 16)


A10, L4, H200 = "NVIDIA A10", "NVIDIA L4", "NVIDIA H200"
A100 = "NVIDIA A100-SXM4-80GB"

SHIPPED: dict[str, Expect] = {
    "cpu-only": Expect(1, 0, False, pcie=None),
    "1xL4": Expect(1, 1, False, (L4,), 22.5, (8, 9)),
    "1xA10": Expect(1, 1, False, (A10,), 22.5, (8, 6)),
    "1xT4": Expect(1, 1, False, ("Tesla T4",), 15, (7, 5), (3, 16)),
    "1xA100-80G": Expect(1, 1, False, (A100,), 80, (8, 0)),
    "1xH200": Expect(1, 1, False, (H200,), 140, (9, 0), (5, 16)),
    "2xA10-pcie": Expect(1, 2, False, (A10,) * 2, 22.5, (8, 6)),
    "4xA10-pcie": Expect(1, 4, False, (A10,) * 4, 22.5, (8, 6)),
    "4xA10-pcie-x4": Expect(1, 4, False, (A10,) * 4, 22.5, (8, 6), (4, 4)),
    "2xA100-nvlink": Expect(1, 2, True, (A100,) * 2, 80, (8, 0)),
    "2xH200-nvlink": Expect(1, 2, True, (H200,) * 2, 140, (9, 0), (5, 16)),
    "8xH200-nvlink": Expect(1, 8, True, (H200,) * 8, 140, (9, 0), (5, 16)),
    "2node-2xA10": Expect(2, 2, False, (A10,) * 2, 22.5, (8, 6)),
    "mixed-A10-L4": Expect(1, 2, False, (A10, L4)),
}


def test_shipped_profile_names() -> None:
    assert list_profiles() == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_profile(name: str) -> None:
    want = SHIPPED[name]
    hw = load_profile(name)
    node = hw.node
    assert hw.nodes == want.nodes
    assert hw.gpus_per_node == want.gpus
    assert hw.total_gpus == want.gpus * want.nodes
    assert hw.source.endswith(f"{name}.toml")
    assert tuple(g.name for g in node.gpus) == want.gpu_names
    assert [g.index for g in node.gpus] == list(range(want.gpus))
    indexes = list(range(want.gpus))
    n_pairs = want.gpus * (want.gpus - 1) // 2
    assert len(node.nvlink_pairs) == (n_pairs if want.nvlinked else 0)
    if want.gpus > 1:
        assert hw.link_of(indexes) == ("nvlink" if want.nvlinked else "pcie")
    for gpu in node.gpus:
        assert gpu.free_bytes == gpu.memory_bytes
        assert (gpu.pcie_gen, gpu.pcie_width) == want.pcie
        assert (gpu.pcie_gen_max, gpu.pcie_width_max) == want.pcie
        if want.memory_gib is not None:
            assert gpu.memory_bytes == want.memory_gib * GIB
        if want.capability is not None:
            assert gpu.compute_capability == want.capability
    assert node.cpu_cores >= 4
    assert node.memory_bytes >= 16 * GIB
    assert hw.has_gpu == (want.gpus > 0)


def test_cpu_only_profile_has_flags() -> None:
    assert load_profile("cpu-only").node.cpu_flags == ("avx2", "avx512f")


def test_mixed_profile_capabilities() -> None:
    gpus = load_profile("mixed-A10-L4").node.gpus
    assert [g.compute_capability for g in gpus] == [(8, 6), (8, 9)]


def test_resolve_hardware() -> None:
    assert resolve_hardware("1xA10") == load_profile("1xA10")
    assert resolve_hardware("auto").source == "detected"
    assert resolve_hardware(" AUTO ").source == "detected"


# ------------------------------------------------------------ hand-written profiles

EXAMPLE = """
name = "2x NVIDIA A10 (PCIe)"
nodes = 1                    # identical nodes
[node]
cpu_cores = 32
memory_gib = 128
numa_nodes = 1               # optional
[[node.gpus]]                # one table per kind of GPU in the node
name = "NVIDIA A10"
count = 2
memory_gib = 24
compute_capability = "8.6"
link = "pcie"                # "pcie" or "nvlink"
pcie_gen = 4
pcie_width = 16
"""


def write(tmp_path: Path, text: str, name: str = "x.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_hand_written_example(tmp_path: Path) -> None:
    path = write(tmp_path, EXAMPLE, "mine.toml")
    hw = load_profile(str(path))
    assert hw.name == "2x NVIDIA A10 (PCIe)"
    assert hw.source == str(path)
    assert hw.node.cpu_cores == 32
    assert hw.node.memory_bytes == 128 * GIB
    assert [g.index for g in hw.node.gpus] == [0, 1]
    assert hw.node.gpus[1].compute_capability == (8, 6)
    assert hw.node.nvlink_pairs == frozenset()


def test_minimal_cpu_profile_with_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "[node]\ncpu_cores = 4\nmemory_gib = 7.5\n", "small.toml")
    hw = load_profile(str(path))
    assert hw.name == "small"
    assert (hw.nodes, hw.node.numa_nodes, hw.has_gpu) == (1, 1, False)
    assert hw.node.memory_bytes == int(7.5 * GIB)


def test_nvlink_only_within_a_table(tmp_path: Path) -> None:
    text = """
name = "two kinds"
[node]
cpu_cores = 8
memory_gib = 64
[[node.gpus]]
name = "A"
count = 2
memory_gib = 23.5
compute_capability = "8.0"
[[node.gpus]]
name = "B"
count = 3
memory_gib = 80
compute_capability = "9.0"
link = "nvlink"
"""
    node = load_profile(str(write(tmp_path, text))).node
    assert [g.index for g in node.gpus] == [0, 1, 2, 3, 4]
    assert [g.name for g in node.gpus] == ["A", "A", "B", "B", "B"]
    assert node.gpus[0].memory_bytes == int(23.5 * GIB)
    assert node.gpus[0].pcie_gen is None
    assert node.nvlink_pairs == frozenset({(2, 3), (2, 4), (3, 4)})
    assert not node.linked(1, 2)


# Each case: the TOML text, and pieces the one-line message must contain.
GOOD_NODE = "[node]\ncpu_cores = 8\nmemory_gib = 32\n"
GPU = '[[node.gpus]]\nname = "G"\nmemory_gib = 24\ncompute_capability = "8.6"\n'
ERRORS: dict[str, tuple[str, tuple[str, ...]]] = {
    "link": (
        GOOD_NODE + GPU + 'link = "pci"\n',
        ("node.gpus[0].link = 'pci'", "allowed values: 'pcie', 'nvlink'"),
    ),
    "node key typo": (
        GOOD_NODE + '[[node.gpu]]\nname = "G"\n',
        (
            "unknown key 'node.gpu'",
            "allowed: cpu_cores, memory_gib, numa_nodes, cpu_flags, gpus",
        ),
    ),
    "top key typo": (
        "node_count = 2\n" + GOOD_NODE,
        ("unknown key 'node_count'", "allowed: name, nodes, node"),
    ),
    "gpu key typo": (
        GOOD_NODE + GPU + "memory_gb = 24\n",
        ("unknown key 'node.gpus[0].memory_gb'", "compute_capability, link"),
    ),
    "missing node": ('name = "x"\n', ("missing required key 'node'",)),
    "missing cores": (
        "[node]\nmemory_gib = 32\n",
        ("missing required key 'node.cpu_cores'",),
    ),
    "missing memory": (
        "[node]\ncpu_cores = 8\n",
        ("missing required key 'node.memory_gib'",),
    ),
    "missing capability": (
        GOOD_NODE + '[[node.gpus]]\nname = "G"\nmemory_gib = 24\n',
        ("missing required key 'node.gpus[0].compute_capability'",),
    ),
    "missing gpu name": (
        GOOD_NODE + '[[node.gpus]]\nmemory_gib = 24\ncompute_capability = "8.6"\n',
        ("missing required key 'node.gpus[0].name'",),
    ),
    "cores as string": (
        '[node]\ncpu_cores = "8"\nmemory_gib = 32\n',
        ("node.cpu_cores = '8'", "must be a whole number"),
    ),
    "cores as bool": (
        "[node]\ncpu_cores = true\nmemory_gib = 32\n",
        ("node.cpu_cores = True", "must be a whole number"),
    ),
    "memory as string": (
        '[node]\ncpu_cores = 8\nmemory_gib = "32G"\n',
        ("node.memory_gib = '32G'", "must be a number of GiB"),
    ),
    "node not a table": ('node = "big"\n', ("node = 'big'", "must be a table")),
    "gpus not tables": (GOOD_NODE + "gpus = 2\n", ("node.gpus = 2", "[[node.gpus]]")),
    "name empty": ('name = ""\n' + GOOD_NODE, ("name = ''", "non-empty string")),
    "count zero": (
        GOOD_NODE + GPU + "count = 0\n",
        ("node.gpus[0].count = 0", "must be at least 1"),
    ),
    "nodes zero": ("nodes = 0\n" + GOOD_NODE, ("nodes = 0", "must be at least 1")),
    "node memory zero": (
        "[node]\ncpu_cores = 8\nmemory_gib = 0\n",
        ("node.memory_gib = 0", "must be greater than 0"),
    ),
    "gpu memory negative": (
        GOOD_NODE + '[[node.gpus]]\nname = "G"\nmemory_gib = -1.5\ncompute_capability = "8.6"\n',
        ("node.gpus[0].memory_gib = -1.5", "must be greater than 0"),
    ),
    "capability no dot": (
        GOOD_NODE + '[[node.gpus]]\nname = "G"\nmemory_gib = 24\ncompute_capability = "86"\n',
        ("node.gpus[0].compute_capability = '86'", 'like "8.6"'),
    ),
    "capability float": (
        GOOD_NODE + '[[node.gpus]]\nname = "G"\nmemory_gib = 24\ncompute_capability = 8.6\n',
        ("node.gpus[0].compute_capability = 8.6", 'like "8.6"'),
    ),
    "pcie width": (
        GOOD_NODE + GPU + "pcie_width = 3\n",
        ("node.gpus[0].pcie_width = 3", "allowed values: 1, 2, 4, 8, 16, 32"),
    ),
    "cpu flag": (
        GOOD_NODE + 'cpu_flags = ["avx512"]\n',
        ("node.cpu_flags has 'avx512'", "allowed values:", "'avx2'"),
    ),
    "syntax": (
        "[node\ncpu_cores = 8\n",
        ("not valid TOML", "line 1"),
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_profile_error(tmp_path: Path, case: str) -> None:
    text, pieces = ERRORS[case]
    path = write(tmp_path, text, "bad.toml")
    with pytest.raises(HardwareError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert message.startswith(f"profile '{path}': ")
    assert "\n" not in message
    for piece in pieces:
        assert piece in message


def test_unknown_profile_name_lists_shipped() -> None:
    with pytest.raises(HardwareError) as info:
        load_profile("9xB200")
    message = str(info.value)
    assert "'9xB200'" in message
    assert "1xA10, 1xA100-80G" in message
    assert "mixed-A10-L4" in message


def test_missing_profile_file(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match=r"not-there\.toml': file not found"):
        load_profile(str(tmp_path / "not-there.toml"))


# ------------------------------------------------------------------ live detection


def test_detect_on_this_machine() -> None:
    hw = detect()
    assert hw.source == "detected"
    assert hw.node.cpu_cores == len(os.sched_getaffinity(0))
    assert hw.node.memory_bytes > 0
    assert hw.name.startswith("this machine: ")
    if hardware._load_nvml() is None:  # the GPU-less box these tests are written on
        assert not hw.has_gpu
        assert hw.name.startswith("this machine: CPU only (")


def test_parse_meminfo() -> None:
    text = "MemFree:  100 kB\nMemTotal:       32768000 kB\n"
    assert parse_meminfo(text) == 32768000 * 1024
    assert parse_meminfo("") == 0


def test_memory_respects_smaller_cgroup_limit(tmp_path: Path) -> None:
    meminfo = write(tmp_path, "MemTotal: 33554432 kB\n", "meminfo")
    limited = write(tmp_path, f"{8 * GIB}\n", "limit")
    unlimited = write(tmp_path, "max\n", "max")
    larger = write(tmp_path, f"{64 * GIB}\n", "larger")
    assert memory_bytes(meminfo, (unlimited,)) == 32 * GIB
    assert memory_bytes(meminfo, (larger, tmp_path / "absent")) == 32 * GIB
    assert memory_bytes(meminfo, (unlimited, limited)) == 8 * GIB
    assert parse_cgroup_limit("max") is None
    with pytest.raises(HardwareError, match="memory size"):
        memory_bytes(tmp_path / "absent", ())


def test_numa_nodes(tmp_path: Path) -> None:
    for name in ("node0", "node1", "node2", "possible", "nodefoo"):
        (tmp_path / name).mkdir()
    assert numa_nodes(tmp_path) == 3
    assert numa_nodes(tmp_path / "absent") == 1


def test_parse_cpu_flags() -> None:
    text = (
        "processor : 0\nflags : fpu avx avx2 avx512f avx512bw amx_tile avx512_vnni\n"
        "processor : 1\nflags : fpu avx512_bf16\n"
    )
    assert parse_cpu_flags(text) == ("amx_tile", "avx2", "avx512_vnni", "avx512f")
    assert parse_cpu_flags("Features : neon asimd\n") == ()


UUIDS = ["GPU-aaaa1111", "GPU-aaaa2222", "GPU-bbbb3333", "GPU-cccc4444"]


@pytest.mark.parametrize(
    ("env", "want"),
    [
        (None, [0, 1, 2, 3]),
        ("", []),
        ("-1", []),
        ("2", [2]),
        ("3,1", [3, 1]),
        (" 1 , 0 ", [1, 0]),
        ("0,7,1", [0]),  # CUDA stops at the first invalid entry
        ("0,-1,1", [0]),
        ("1,1", [1]),
        ("GPU-bbbb", [2]),
        ("GPU-cccc4444,0", [3, 0]),
        ("GPU-aaaa", []),  # ambiguous prefix
        ("GPU-ffff", []),
        ("MIG-1234", []),
        ("foo", []),
    ],
)
def test_visible_indexes(env: str | None, want: list[int]) -> None:
    assert visible_indexes(env, UUIDS) == want


def test_reindex_pairs() -> None:
    pairs = {(0, 1), (2, 3), (1, 3)}
    assert reindex_pairs(pairs, [3, 1]) == frozenset({(0, 1)})
    assert reindex_pairs(pairs, [2, 3, 0, 1]) == frozenset({(0, 1), (2, 3), (1, 3)})
    assert reindex_pairs(pairs, []) == frozenset()


def test_nvlink_pairs_from_remotes() -> None:
    buses = ["00000000:1B:00.0", "00000000:43:00.0", "00000000:52:00.0"]
    remotes = {
        0: ["0000:43:00.0", "0000:43:00.0", "00000000:1B:00.0"],  # twice; itself
        1: ["00000000:1b:00.0", "00000000:99:00.0"],  # 99 is an NVSwitch
        2: [],
    }
    assert nvlink_pairs_from_remotes(buses, remotes) == frozenset({(0, 1)})
    assert normalize_bus_id(b"00000000:1B:00.0\x00") == "0000:1b:00.0"


def test_describe_node() -> None:
    gpu = load_profile("mixed-A10-L4").node.gpus
    node = NodeInfo(cpu_cores=4, memory_bytes=GIB, gpus=(gpu[0], gpu[0], gpu[1]))
    assert describe_node(node) == "2x NVIDIA A10 + 1x NVIDIA L4"
    assert describe_node(NodeInfo(cpu_cores=4, memory_bytes=16 * GIB)) == ("CPU only (4 cores, 16 GiB)")


# ------------------------------------------------- NVML reading, through a fake pynvml
# This machine has no GPU, so NVML never initialises here and the GPU branches of
# detect() cannot run for real. These tests feed read_gpus a tiny stand-in for pynvml
# for exactly those branches; everything else above runs on the real machine.


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


def test_read_gpus_all_visible() -> None:
    gpus, pairs = read_gpus(four_gpus(), None)
    assert [(g.index, g.name) for g in gpus] == [
        (0, "G0"),
        (1, "G1"),
        (2, "G2"),
        (3, "G3"),
    ]
    assert pairs == frozenset({(0, 1), (2, 3)})
    g0 = gpus[0]
    assert (g0.memory_bytes, g0.free_bytes) == (80 * GIB, 70 * GIB)
    assert g0.compute_capability == (9, 0)
    assert (g0.pcie_gen, g0.pcie_width, g0.pcie_gen_max, g0.pcie_width_max) == (
        3,
        16,
        4,
        16,
    )
    assert (gpus[3].pcie_gen, gpus[3].pcie_width_max) == (None, None)


def test_read_gpus_honours_visible_devices() -> None:
    gpus, pairs = read_gpus(four_gpus(), "3,GPU-0000,2")
    assert [(g.index, g.name) for g in gpus] == [(0, "G3"), (1, "G0"), (2, "G2")]
    assert gpus[1].free_bytes == 70 * GIB  # read from NVML device 0
    assert pairs == frozenset({(0, 2)})  # NVML 2<->3; 0<->1 lost its partner
    assert read_gpus(four_gpus(), "") == ((), frozenset())


def test_read_gpus_nvswitch_pairs_from_p2p_status() -> None:
    # On HGX boards every link ends at an NVSwitch, whose bus id is no GPU's.
    switch = "00000000:99:00.0"
    nvml = FakeNVML(
        [FakeGPU(f"H{i}", f"0000000{i}:00:00.0", [switch] * 3) for i in range(3)],
        p2p={(0, 1), (0, 2), (1, 2)},
    )
    _, pairs = read_gpus(nvml, "2,0")
    assert pairs == frozenset({(0, 1)})


def test_read_gpus_unreadable_memory_is_an_error() -> None:
    nvml = four_gpus()
    nvml.gpus[1].memory_ok = False
    with pytest.raises(HardwareError, match="NVML cannot read GPU 1"):
        read_gpus(nvml, None)
    assert read_gpus(nvml, "0")[0][0].name == "G0"  # a hidden broken GPU is not read


def test_detect_with_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = four_gpus()
    monkeypatch.setattr(hardware, "_load_nvml", lambda: nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    hw = detect()
    assert isinstance(hw, Hardware)
    assert hw.name == "this machine: 1x G0 + 1x G1"
    assert hw.node.nvlink_pairs == frozenset({(0, 1)})
    assert hw.link_of([0, 1]) == "nvlink"
    assert nvml.shut_down
