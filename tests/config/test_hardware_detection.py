"""Live detection: /proc, cgroup limits, sysfs, and NVML through a fake pynvml."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.fake_nvml import FakeGPU, FakeNVML, four_gpus

from config.errors import HardwareError
from config.hardware import (
    GIB,
    Hardware,
    NodeInfo,
    describe_node,
    detect,
    load_profile,
    memory_bytes,
    numa_nodes,
    parse_cgroup_limit,
    parse_cpu_flags,
    parse_meminfo,
    read_gpus,
)
from config.hardware import nvml as nvml_helpers


def write(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------ live detection


def test_detect_on_this_machine() -> None:
    hw = detect()
    assert hw.source == "detected"
    assert hw.node.cpu_cores == len(os.sched_getaffinity(0))
    assert hw.node.memory_bytes > 0
    assert hw.name.startswith("this machine: ")
    if nvml_helpers.load_nvml()[0] is None:  # the GPU-less box these tests are written on
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


def test_describe_node() -> None:
    gpu = load_profile("mixed-A10-L4").node.gpus
    node = NodeInfo(cpu_cores=4, memory_bytes=GIB, gpus=(gpu[0], gpu[0], gpu[1]))
    assert describe_node(node) == "2x NVIDIA A10 + 1x NVIDIA L4"
    assert describe_node(NodeInfo(cpu_cores=4, memory_bytes=16 * GIB)) == ("CPU only (4 cores, 16 GiB)")


# ------------------------------------------------- NVML reading, through a fake pynvml


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
    monkeypatch.setattr(nvml_helpers, "load_nvml", lambda: (nvml, ""))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    hw = detect()
    assert isinstance(hw, Hardware)
    assert hw.name == "this machine: 1x G0 + 1x G1"
    assert hw.node.nvlink_pairs == frozenset({(0, 1)})
    assert hw.link_of([0, 1]) == "nvlink"
    assert nvml.shut_down
