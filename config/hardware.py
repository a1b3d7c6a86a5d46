"""What the engine will run on: GPUs, their links, CPU and memory, one node or several.

The same ``Hardware`` object comes from live detection (NVML, /proc) or from a profile
file, so the planner never knows which: that is what lets a user plan for a machine they
do not have yet (``--hardware 8xH200-nvlink``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from contextlib import suppress
from functools import cached_property
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from config.errors import HardwareError

GIB = 1024**3

LinkKind = Literal["pcie", "nvlink"]


class GPUInfo(BaseModel):
    """One GPU as the planner needs it."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0)
    """Index as CUDA numbers it after ``CUDA_VISIBLE_DEVICES`` is applied."""
    name: str
    memory_bytes: int = Field(gt=0)
    free_bytes: int = Field(ge=0)
    """Free memory when detected; other processes' use lowers gpu_memory_utilization."""
    compute_capability: tuple[int, int]
    pcie_gen: int | None = None
    """Current PCIe link generation (idle GPUs may train down; compare with the max)."""
    pcie_width: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None

    @property
    def supports_bf16(self) -> bool:
        return self.compute_capability >= (8, 0)


class NodeInfo(BaseModel):
    """One machine. Several nodes in a ``Hardware`` are identical copies of this."""

    model_config = ConfigDict(frozen=True)

    cpu_cores: int = Field(ge=1)
    memory_bytes: int = Field(gt=0)
    numa_nodes: int = Field(default=1, ge=1)
    cpu_flags: tuple[str, ...] = ()
    """Instruction-set flags that matter to the CPU engine (avx2, avx512f, avx512_bf16, amx_bf16)."""
    gpus: tuple[GPUInfo, ...] = ()
    nvlink_pairs: frozenset[tuple[int, int]] = frozenset()
    """Pairs (i, j), i < j, of GPU indexes joined by NVLink."""

    def linked(self, a: int, b: int) -> bool:
        return (min(a, b), max(a, b)) in self.nvlink_pairs

    def all_nvlinked(self, indexes: list[int] | tuple[int, ...]) -> bool:
        """True when every pair among ``indexes`` is joined by NVLink."""
        return all(self.linked(a, b) for a, b in combinations(indexes, 2))


class Hardware(BaseModel):
    """A node description and how many identical nodes there are."""

    model_config = ConfigDict(frozen=True)

    name: str
    source: str
    """'detected' or the profile file it was read from."""
    nodes: int = Field(default=1, ge=1)
    node: NodeInfo

    @cached_property
    def gpus_per_node(self) -> int:
        return len(self.node.gpus)

    @cached_property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def has_gpu(self) -> bool:
        return self.gpus_per_node > 0

    def link_of(self, indexes: list[int] | tuple[int, ...]) -> LinkKind:
        """The slowest link among a group of GPUs on one node."""
        return "nvlink" if self.node.all_nvlinked(indexes) else "pcie"


# --------------------------------------------------------------------------- detection

CPU_FLAGS_OF_INTEREST = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile"})
"""The flags the CPU engine's kernels choose between; the rest of /proc/cpuinfo is noise."""

_PROC_MEMINFO = Path("/proc/meminfo")
_PROC_CPUINFO = Path("/proc/cpuinfo")
_SYS_NODES = Path("/sys/devices/system/node")
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def detect() -> Hardware:
    """Inventory this machine, so the planner sizes the engine for what is really here."""
    gpus: tuple[GPUInfo, ...] = ()
    pairs: frozenset[tuple[int, int]] = frozenset()
    nvml = _load_nvml()
    if nvml is not None:
        try:
            gpus, pairs = read_gpus(nvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
        finally:
            with suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
    node = NodeInfo(
        cpu_cores=cpu_cores(),
        memory_bytes=memory_bytes(),
        numa_nodes=numa_nodes(),
        cpu_flags=cpu_flags(),
        gpus=gpus,
        nvlink_pairs=pairs,
    )
    return Hardware(name=f"this machine: {describe_node(node)}", source="detected", node=node)


def describe_node(node: NodeInfo) -> str:
    """A short human label, e.g. '2x NVIDIA H200' or 'CPU only (8 cores, 32 GiB)'."""
    if not node.gpus:
        return f"CPU only ({node.cpu_cores} cores, {node.memory_bytes / GIB:.0f} GiB)"
    counts: dict[str, int] = {}
    for gpu in node.gpus:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
    return " + ".join(f"{n}x {name}" for name, n in counts.items())


def cpu_cores() -> int:
    """Cores this process may run on (taskset/cgroup cpusets), not the host's total."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def memory_bytes(meminfo: Path = _PROC_MEMINFO, cgroup_limits: tuple[Path, ...] = _CGROUP_LIMITS) -> int:
    """RAM this process can use: MemTotal, lowered by a container's cgroup limit."""
    total = parse_meminfo(_read_text(meminfo))
    for path in cgroup_limits:
        limit = parse_cgroup_limit(_read_text(path))
        if limit is not None and (total <= 0 or limit < total):
            total = limit
    if total <= 0:
        raise HardwareError(f"cannot read the memory size from {meminfo}; pass --hardware PROFILE")
    return total


def parse_meminfo(text: str) -> int:
    """MemTotal in bytes from /proc/meminfo text; 0 when absent."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemTotal":
            parts = rest.split()
            if parts and parts[0].isdigit():
                unit = parts[1].lower() if len(parts) > 1 else "b"
                return int(parts[0]) * (1024 if unit == "kb" else 1)
    return 0


def parse_cgroup_limit(text: str) -> int | None:
    """A cgroup memory limit in bytes; None for 'max', empty or unreadable."""
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def numa_nodes(sys_nodes: Path = _SYS_NODES) -> int:
    """NUMA node count; 1 where sysfs does not say (containers without /sys)."""
    try:
        found = sum(1 for p in sys_nodes.glob("node[0-9]*") if p.name[4:].isdigit())
    except OSError:
        found = 0
    return max(1, found)


def cpu_flags(cpuinfo: Path = _PROC_CPUINFO) -> tuple[str, ...]:
    """The instruction-set flags of this CPU that matter to the CPU engine."""
    return parse_cpu_flags(_read_text(cpuinfo))


def parse_cpu_flags(text: str) -> tuple[str, ...]:
    """Filter the first 'flags' line of /proc/cpuinfo to the flags of interest, sorted."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "flags":
            return tuple(sorted(CPU_FLAGS_OF_INTEREST.intersection(rest.split())))
    return ()


def _read_text(path: Path) -> str:
    """File text, or '' when it is missing or unreadable (not every box has every file)."""
    try:
        return path.read_text()
    except OSError:
        return ""


def _load_nvml() -> Any | None:
    """pynvml, initialised; None where there is no library or no driver (a CPU machine)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # LibraryNotFound, DriverNotLoaded, ...: no usable GPU
        return None
    return pynvml


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


def reindex_pairs(pairs: Iterable[tuple[int, int]], visible: Sequence[int]) -> frozenset[tuple[int, int]]:
    """NVML-index pairs -> CUDA-index pairs; pairs touching a hidden GPU are dropped."""
    position = {nvml_index: cuda_index for cuda_index, nvml_index in enumerate(visible)}
    out: set[tuple[int, int]] = set()
    for a, b in pairs:
        if a in position and b in position:
            x, y = position[a], position[b]
            out.add((min(x, y), max(x, y)))
    return frozenset(out)


def normalize_bus_id(bus_id: str | bytes) -> str:
    """'00000000:1B:00.0' and '0000:1b:00.0' name the same device; compare them equal."""
    text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else bus_id
    text = text.strip("\x00 ").lower()
    domain, sep, rest = text.partition(":")
    if sep and rest.count(":") == 1:
        with suppress(ValueError):
            return f"{int(domain, 16):04x}:{rest}"
    return text


def read_gpus(nvml: Any, cuda_visible_devices: str | None) -> tuple[tuple[GPUInfo, ...], frozenset[tuple[int, int]]]:
    """Visible GPUs (CUDA-indexed) and their NVLink pairs from an initialised pynvml."""
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
    except nvml.NVMLError as exc:
        raise HardwareError(f"NVML cannot list the GPUs: {exc}; check nvidia-smi") from exc
    visible = visible_indexes(cuda_visible_devices, uuids)
    gpus = tuple(_read_gpu(nvml, handles[n], cuda_index) for cuda_index, n in enumerate(visible))
    bus_ids = [_bus_id(nvml, h) for h in handles]
    remotes = {n: _nvlink_remotes(nvml, handles[n]) for n in visible}
    pairs = set(nvlink_pairs_from_remotes(bus_ids, remotes))
    pairs |= _p2p_nvlink_pairs(nvml, handles, visible)
    return gpus, reindex_pairs(pairs, visible)


def _read_gpu(nvml: Any, handle: Any, cuda_index: int) -> GPUInfo:
    """One GPU's planner-relevant facts; a GPU without name/memory/capability is an error."""
    try:
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    except nvml.NVMLError as exc:
        raise HardwareError(
            f"NVML cannot read GPU {cuda_index}: {exc}; check nvidia-smi or pass --hardware PROFILE"
        ) from exc
    return GPUInfo(
        index=cuda_index,
        name=name,
        memory_bytes=int(memory.total),
        free_bytes=int(memory.free),
        compute_capability=(int(major), int(minor)),
        pcie_gen=_optional(nvml, nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        pcie_width=_optional(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        pcie_gen_max=_optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        pcie_width_max=_optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
    )


def _optional(nvml: Any, query: Any, handle: Any) -> int | None:
    """A PCIe figure, or None where the GPU (vGPU, some SXM boards) does not report it."""
    try:
        value = query(handle)
    except nvml.NVMLError:
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


def _bus_id(nvml: Any, handle: Any) -> str:
    """A GPU's PCI bus id; '' when unreadable, so that no link can point at it."""
    try:
        return _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    except nvml.NVMLError:
        return ""


def _nvlink_remotes(nvml: Any, handle: Any) -> list[str]:
    """Remote PCI bus ids of a GPU's active NVLinks; unsupported or failing links are none."""
    remotes: list[str] = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            remotes.append(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except nvml.NVMLError:
            continue
    return remotes


def _p2p_nvlink_pairs(nvml: Any, handles: Sequence[Any], visible: Sequence[int]) -> set[tuple[int, int]]:
    """NVML-index pairs that reach each other over NVLink through an NVSwitch.

    On HGX boards every link ends at a switch, so the remote bus ids name no GPU; the
    driver's P2P status (what vLLM itself checks) still says the pair is NVLinked.
    """
    pairs: set[tuple[int, int]] = set()
    caps = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
    if caps is None or not hasattr(nvml, "nvmlDeviceGetP2PStatus"):
        return pairs
    for a, b in combinations(sorted(visible), 2):
        try:
            status = nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], caps)
        except nvml.NVMLError:
            continue
        if status == nvml.NVML_P2P_STATUS_OK:
            pairs.add((a, b))
    return pairs


def _text(value: str | bytes) -> str:
    """pynvml returns str in recent releases and bytes in old ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- profiles

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
"""Shipped profiles; ``--hardware NAME`` means ``PROFILE_DIR / f'{NAME}.toml'``."""

_TOP_KEYS = ("name", "nodes", "node")
_NODE_KEYS = ("cpu_cores", "memory_gib", "numa_nodes", "cpu_flags", "gpus")
_GPU_KEYS = (
    "name",
    "count",
    "memory_gib",
    "compute_capability",
    "link",
    "pcie_gen",
    "pcie_width",
)
_LINKS = ("pcie", "nvlink")
_PCIE_WIDTHS = (1, 2, 4, 8, 16, 32)
_CAPABILITY = re.compile(r"^(\d+)\.(\d+)$")


def list_profiles() -> list[str]:
    """Names of the shipped profiles, for help text and error messages."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def resolve_hardware(spec: str) -> Hardware:
    """``--hardware`` value -> Hardware: 'auto' detects, anything else is a profile."""
    if spec.strip().lower() == "auto":
        return detect()
    return load_profile(spec)


def load_profile(name_or_path: str) -> Hardware:
    """Read a profile: a path to a .toml file, or the name of a shipped profile."""
    spec = name_or_path.strip()
    is_path = spec.endswith(".toml") or "/" in spec or os.sep in spec
    path = Path(spec).expanduser() if is_path else PROFILE_DIR / f"{spec}.toml"
    label = spec if is_path else path.name
    if not path.is_file():
        if is_path:
            raise HardwareError(f"profile '{label}': file not found")
        raise HardwareError(
            f"unknown hardware profile {spec!r}; shipped: {', '.join(list_profiles())}"
            " (or 'auto', or a path to a .toml file)"
        )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise HardwareError(f"profile '{label}': not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise HardwareError(f"profile '{label}': cannot read: {exc}") from exc
    return _ProfileReader(label).hardware(data, source=str(path), default_name=path.stem)


class _ProfileReader:
    """Checks a parsed profile key by key, so each error names the file and the key."""

    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, message: str) -> HardwareError:
        return HardwareError(f"profile '{self.label}': {message}")

    def hardware(self, data: dict[str, Any], source: str, default_name: str) -> Hardware:
        self.check_keys(data, "", _TOP_KEYS)
        name = self.string(data, "", "name", default=default_name)
        nodes = self.integer(data, "", "nodes", default=1, minimum=1)
        node = self.node(self.table(data, "", "node"))
        try:
            return Hardware(name=name, source=source, nodes=nodes, node=node)
        except ValidationError as exc:  # the checks above should leave nothing for this
            raise self.fail(str(exc).splitlines()[0]) from exc

    def node(self, data: dict[str, Any]) -> NodeInfo:
        self.check_keys(data, "node.", _NODE_KEYS)
        cores = self.integer(data, "node.", "cpu_cores", minimum=1)
        memory = self.gib(data, "node.", "memory_gib")
        numa = self.integer(data, "node.", "numa_nodes", minimum=1, default=1)
        cpu_flags = self.string_list(data, "node.", "cpu_flags")
        for flag in cpu_flags:
            if flag not in CPU_FLAGS_OF_INTEREST:
                raise self.fail(
                    f"node.cpu_flags has {flag!r}: allowed values: "
                    + ", ".join(repr(f) for f in sorted(CPU_FLAGS_OF_INTEREST))
                )
        raw_gpus = data.get("gpus", [])
        if not isinstance(raw_gpus, list) or not all(isinstance(t, dict) for t in raw_gpus):
            raise self.fail(f"node.gpus = {raw_gpus!r}: must be tables written as [[node.gpus]]")
        gpus: list[GPUInfo] = []
        pairs: set[tuple[int, int]] = set()
        for position, table in enumerate(raw_gpus):
            group, link = self.gpu_group(table, f"node.gpus[{position}].", first_index=len(gpus))
            if link == "nvlink":
                pairs.update(combinations([g.index for g in group], 2))
            gpus.extend(group)
        return NodeInfo(
            cpu_cores=cores,
            memory_bytes=memory,
            numa_nodes=numa,
            cpu_flags=tuple(sorted(set(cpu_flags))),
            gpus=tuple(gpus),
            nvlink_pairs=frozenset(pairs),
        )

    def gpu_group(self, data: dict[str, Any], prefix: str, first_index: int) -> tuple[list[GPUInfo], str]:
        """One [[node.gpus]] table -> ``count`` GPUs with consecutive indexes, and its link."""
        self.check_keys(data, prefix, _GPU_KEYS)
        name = self.string(data, prefix, "name")
        count = self.integer(data, prefix, "count", minimum=1, default=1)
        memory = self.gib(data, prefix, "memory_gib")
        capability = self.capability(data, prefix)
        link = self.string(data, prefix, "link", default="pcie")
        if link not in _LINKS:
            raise self.fail(f"{prefix}link = {link!r}: allowed values: " + ", ".join(repr(k) for k in _LINKS))
        gen = self.optional_integer(data, prefix, "pcie_gen", minimum=1)
        width = self.optional_integer(data, prefix, "pcie_width", minimum=1)
        if width is not None and width not in _PCIE_WIDTHS:
            raise self.fail(
                f"{prefix}pcie_width = {width!r}: allowed values: " + ", ".join(str(w) for w in _PCIE_WIDTHS)
            )
        group = [
            GPUInfo(
                index=first_index + i,
                name=name,
                memory_bytes=memory,
                free_bytes=memory,
                compute_capability=capability,
                pcie_gen=gen,
                pcie_width=width,
                pcie_gen_max=gen,
                pcie_width_max=width,
            )
            for i in range(count)
        ]
        return group, link

    def check_keys(self, data: dict[str, Any], prefix: str, allowed: tuple[str, ...]) -> None:
        for key in data:
            if key not in allowed:
                raise self.fail(f"unknown key '{prefix}{key}'; allowed: {', '.join(allowed)}")

    def required(self, data: dict[str, Any], prefix: str, key: str) -> Any:
        if key not in data:
            raise self.fail(f"missing required key '{prefix}{key}'")
        return data[key]

    def table(self, data: dict[str, Any], prefix: str, key: str) -> dict[str, Any]:
        value = self.required(data, prefix, key)
        if not isinstance(value, dict):
            raise self.fail(f"{prefix}{key} = {value!r}: must be a table, written [{prefix}{key}]")
        return value

    def string(self, data: dict[str, Any], prefix: str, key: str, default: str | None = None) -> str:
        value = data.get(key, default) if default is not None else self.required(data, prefix, key)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(f"{prefix}{key} = {value!r}: must be a non-empty string")
        return value.strip()

    def string_list(self, data: dict[str, Any], prefix: str, key: str) -> list[str]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{prefix}{key} = {value!r}: must be a list of strings")
        return value

    def integer(
        self,
        data: dict[str, Any],
        prefix: str,
        key: str,
        *,
        minimum: int,
        default: int | None = None,
    ) -> int:
        """A whole number >= minimum; required when there is no default."""
        value = data.get(key, default) if default is not None else self.required(data, prefix, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{prefix}{key} = {value!r}: must be a whole number")
        if value < minimum:
            raise self.fail(f"{prefix}{key} = {value!r}: must be at least {minimum}")
        return value

    def optional_integer(self, data: dict[str, Any], prefix: str, key: str, *, minimum: int) -> int | None:
        return self.integer(data, prefix, key, minimum=minimum) if key in data else None

    def gib(self, data: dict[str, Any], prefix: str, key: str) -> int:
        value = self.required(data, prefix, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(f"{prefix}{key} = {value!r}: must be a number of GiB, like 24 or 23.5")
        if not value > 0 or value == float("inf"):
            raise self.fail(f"{prefix}{key} = {value!r}: must be greater than 0")
        return round(value * GIB)

    def capability(self, data: dict[str, Any], prefix: str) -> tuple[int, int]:
        value = self.required(data, prefix, "compute_capability")
        match = _CAPABILITY.match(value.strip()) if isinstance(value, str) else None
        if match is None:
            raise self.fail(f'{prefix}compute_capability = {value!r}: must be a string like "8.6" (major.minor)')
        return int(match[1]), int(match[2])
