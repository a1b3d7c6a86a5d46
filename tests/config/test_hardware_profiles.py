"""Hardware profiles: the shipped ones, hand-written ones, and their one-line errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from config.errors import HardwareError
from config.hardware import GIB, list_profiles, load_profile, resolve_hardware

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
    "1xH100": Expect(1, 1, False, ("NVIDIA H100 80GB HBM3",), 79, (9, 0), (5, 16)),
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


def test_mps_is_assumed_with_gpus_unless_the_profile_says_not(tmp_path: Path) -> None:
    assert load_profile("1xH200").node.mps and not load_profile("cpu-only").node.mps
    without = load_profile(str(write(tmp_path, GOOD_NODE + "mps = false\n" + GPU))).node
    assert without.gpus and not without.mps


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
    "mps as string": (
        GOOD_NODE + 'mps = "yes"\n' + GPU,
        ("node.mps = 'yes'", "must be true or false"),
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
    "nodes a typo": ("nodes = 5000\n" + GOOD_NODE, ("nodes = 5000", "must be at most 1024")),
    "count a typo": (
        GOOD_NODE + GPU + "count = 1000\n",
        ("node.gpus[0].count = 1000", "must be at most 64"),
    ),
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
