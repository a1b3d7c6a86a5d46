"""NVML helpers (config.hardware.nvml): index mapping, links, and reading through a fake pynvml."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from support.fake_nvml import FakeGPU, FakeNVML, four_gpus

from config.hardware.nvml import (
    PcieLink,
    device_handles,
    load_nvml,
    normalize_bus_id,
    nvlink_pairs_from_remotes,
    optional,
    p2p_nvlinked,
    pcie_link,
    reindex_pairs,
    text,
    visible_indexes,
)

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
    remotes: dict[int, Iterable[str]] = {
        0: ["0000:43:00.0", "0000:43:00.0", "00000000:1B:00.0"],  # twice; itself
        1: ["00000000:1b:00.0", "00000000:99:00.0"],  # 99 is an NVSwitch
        2: [],
    }
    assert nvlink_pairs_from_remotes(buses, remotes) == frozenset({(0, 1)})
    assert normalize_bus_id(b"00000000:1B:00.0\x00") == "0000:1b:00.0"


def test_load_nvml_says_why_not_on_a_gpu_less_machine() -> None:
    nvml, why = load_nvml()
    if nvml is None:  # the GPU-less box these tests are written on
        assert why.startswith(("nvidia-ml-py is not installed", "NVML unavailable ("))
    else:
        assert why == ""
        nvml.nvmlShutdown()


def test_text_takes_str_and_bytes() -> None:
    assert text("GPU-1") == "GPU-1"
    assert text(b"GPU-1") == "GPU-1"
    assert text(b"\xffx") == "\ufffdx"


def test_optional_and_pcie_link() -> None:
    nvml = four_gpus()
    assert optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, 0) == 16
    assert optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, 3) is None  # not supported: None
    assert optional(nvml, lambda h: 0, 0) is None  # zero is "not reported"
    assert pcie_link(nvml, 0) == PcieLink(gen=3, width=16, gen_max=4, width_max=16)
    assert pcie_link(nvml, 3) == PcieLink(None, None, None, None)


def test_device_handles_and_p2p() -> None:
    handles, uuids = device_handles(four_gpus())
    assert handles == [0, 1, 2, 3]
    assert uuids[1] == "GPU-1111-uuid"
    assert visible_indexes("GPU-2222", uuids) == [2]
    switched = FakeNVML([FakeGPU("H0", "0:0"), FakeGPU("H1", "0:1")], p2p={(0, 1)})
    assert p2p_nvlinked(switched, 0, 1) is True
    assert p2p_nvlinked(FakeNVML([FakeGPU("A", "a"), FakeGPU("B", "b")], p2p=set()), 0, 1) is False
    assert p2p_nvlinked(four_gpus(), 0, 1) is None  # the query is not supported there
