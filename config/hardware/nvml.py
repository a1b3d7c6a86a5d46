"""NVML (pynvml) helpers shared by detection and by ``verify``: load it, read it, map its indexes.

NVML numbers GPUs its own way; CUDA numbers the ones ``CUDA_VISIBLE_DEVICES`` leaves, in its
order. Everything here that takes an index says which numbering it means.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import suppress
from itertools import combinations
from typing import Any, NamedTuple


def load_nvml() -> tuple[Any | None, str]:
    """pynvml, initialised, and ''; or None and why not (no library, no driver: a CPU machine).

    The caller shuts it down (``nvml.nvmlShutdown()``) when done.
    """
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:  # LibraryNotFound, DriverNotLoaded, ...: no usable GPU
        return None, f"NVML unavailable ({err})"
    return pynvml, ""


def text(value: str | bytes) -> str:
    """pynvml returns str in recent releases and bytes in old ones; always str."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def optional(nvml: Any, query: Any, handle: Any) -> int | None:
    """A positive figure from ``query(handle)``, or None where the GPU does not report it.

    For PCIe generation and width, which vGPUs and some SXM boards leave unsupported.
    """
    try:
        value = query(handle)
    except nvml.NVMLError:
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


class PcieLink(NamedTuple):
    """A GPU's PCIe link now (idle GPUs may train down) and at most; None where not reported."""

    gen: int | None
    width: int | None
    gen_max: int | None
    width_max: int | None


def pcie_link(nvml: Any, handle: Any) -> PcieLink:
    """The current and maximum PCIe generation and width of one GPU."""
    return PcieLink(
        gen=optional(nvml, nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        width=optional(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        gen_max=optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        width_max=optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
    )


def device_handles(nvml: Any) -> tuple[list[Any], list[str]]:
    """Every GPU's handle and UUID, in NVML order; raises ``nvml.NVMLError`` when NVML cannot list them."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    return handles, [text(nvml.nvmlDeviceGetUUID(h)) for h in handles]


def visible_indexes(env: str | None, uuids: Sequence[str]) -> list[int]:
    """NVML indexes that CUDA will see, in CUDA's order, from ``CUDA_VISIBLE_DEVICES``.

    Follows CUDA: unset means all; entries are NVML indexes or (prefixes of) UUIDs
    ('GPU-...'); the list stops at the first entry that is invalid, repeated, ambiguous or
    not supported here (MIG), so '' and '-1' mean no GPU.
    """
    if env is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for raw in env.split(","):
        entry = raw.strip()
        index: int | None = None
        if entry.lstrip("+-").isdigit():
            number = int(entry)
            index = number if 0 <= number < len(uuids) else None
        elif entry.startswith("GPU-"):
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            index = matches[0] if len(matches) == 1 else None
        if index is None or index in chosen:
            break
        chosen.append(index)
    return chosen


def normalize_bus_id(bus_id: str | bytes) -> str:
    """'00000000:1B:00.0' and '0000:1b:00.0' name the same device; compare them equal."""
    value = text(bus_id).strip("\x00 ").lower()
    domain, sep, rest = value.partition(":")
    if sep and rest.count(":") == 1:
        with suppress(ValueError):
            return f"{int(domain, 16):04x}:{rest}"
    return value


def bus_id(nvml: Any, handle: Any) -> str:
    """A GPU's PCI bus id; '' when unreadable, so that no link can point at it."""
    try:
        return text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    except nvml.NVMLError:
        return ""


def nvlink_remotes(nvml: Any, handle: Any) -> list[str]:
    """Remote PCI bus ids of a GPU's active NVLinks; unsupported or failing links are none."""
    remotes: list[str] = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            remotes.append(text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except nvml.NVMLError:
            continue
    return remotes


def nvlink_pairs_from_remotes(bus_ids: Sequence[str], remotes: dict[int, Iterable[str]]) -> frozenset[tuple[int, int]]:
    """Pairs (i, j), i < j, of NVML indexes where a link of one ends at the other's bus id.

    ``bus_ids[i]`` is GPU i's PCI bus id; ``remotes[i]`` the remote bus ids of GPU i's
    active links. Remotes that are no GPU here (NVSwitches, hidden GPUs) give no pair.
    """
    by_bus = {normalize_bus_id(bus): i for i, bus in enumerate(bus_ids)}
    pairs: set[tuple[int, int]] = set()
    for i, ends in remotes.items():
        for end in ends:
            j = by_bus.get(normalize_bus_id(end))
            if j is not None and j != i:
                pairs.add((min(i, j), max(i, j)))
    return frozenset(pairs)


def p2p_nvlinked(nvml: Any, a: Any, b: Any) -> bool | None:
    """Whether the driver's P2P status says GPUs (handles) ``a`` and ``b`` reach each other over NVLink.

    This is what vLLM itself checks, and it sees through NVSwitches. None where this pynvml or
    GPU cannot say (no P2P query, or the query fails).
    """
    caps = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
    if caps is None or not hasattr(nvml, "nvmlDeviceGetP2PStatus"):
        return None
    try:
        return bool(nvml.nvmlDeviceGetP2PStatus(a, b, caps) == nvml.NVML_P2P_STATUS_OK)
    except nvml.NVMLError:
        return None


def p2p_nvlink_pairs(nvml: Any, handles: Sequence[Any], visible: Sequence[int]) -> set[tuple[int, int]]:
    """NVML-index pairs among ``visible`` that reach each other over NVLink (through an NVSwitch, too).

    On HGX boards every link ends at a switch, so the remote bus ids name no GPU; the
    driver's P2P status still says the pair is NVLinked.
    """
    return {(a, b) for a, b in combinations(sorted(visible), 2) if p2p_nvlinked(nvml, handles[a], handles[b])}


def reindex_pairs(pairs: Iterable[tuple[int, int]], visible: Sequence[int]) -> frozenset[tuple[int, int]]:
    """NVML-index pairs -> CUDA-index pairs; pairs touching a hidden GPU are dropped."""
    position = {nvml_index: cuda_index for cuda_index, nvml_index in enumerate(visible)}
    out: set[tuple[int, int]] = set()
    for a, b in pairs:
        if a in position and b in position:
            x, y = position[a], position[b]
            out.add((min(x, y), max(x, y)))
    return frozenset(out)
