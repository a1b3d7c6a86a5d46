"""Hardware profiles: TOML files describing a machine, so a plan can be made for one not at hand.

The same ``Hardware`` object comes from live detection or from a profile, so the planner never
knows which: that is what lets a user plan for a machine they do not have yet
(``--hardware 8xH200-nvlink``). A profile is read by pydantic models that forbid unknown keys;
every error becomes one line naming the file, the key and what is allowed.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable
from itertools import combinations
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainValidator, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from config.errors import HardwareError
from config.hardware.detection import detect
from config.hardware.types import CPU_FLAGS_OF_INTEREST, GIB, GPUInfo, Hardware, NodeInfo

PROFILE_DIR = Path(__file__).resolve().parents[1] / "profiles"
"""Shipped profiles; ``--hardware NAME`` means ``PROFILE_DIR / f'{NAME}.toml'``."""

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
            what = "a directory, not a .toml file" if path.is_dir() else "file not found"
            raise HardwareError(f"profile '{label}': {what}")
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
    try:
        profile = ProfileFile.model_validate(data)
    except ValidationError as exc:
        raise HardwareError(f"profile '{label}': {_first_problem(exc, data)}") from None
    try:
        return profile.hardware(source=str(path), default_name=path.stem)
    except ValidationError as exc:  # the models above should leave nothing for this
        raise HardwareError(f"profile '{label}': {str(exc).splitlines()[0]}") from exc


# --------------------------------------------------------------------------- value checks
# Each raises a PydanticCustomError whose message is the part after "key = value: ".


def _bad(message: str, **ctx: Any) -> PydanticCustomError:
    return PydanticCustomError("profile", message.replace("{", "{{").replace("}", "}}"), ctx or None)


def _whole(minimum: int, maximum: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad("must be a whole number")
        if value < minimum:
            raise _bad(f"must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise _bad(f"must be at most {maximum}")
        return value

    return check


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad("must be a non-empty string")
    return value.strip()


def _gib(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad("must be a number of GiB, like 24 or 23.5")
    if not value > 0 or math.isinf(value):
        raise _bad("must be greater than 0")
    return value


def _positive(unit: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(f"must be a number of {unit}, like 600 or 3350")
        if not value > 0 or math.isinf(value):
            raise _bad("must be greater than 0")
        return float(value)

    return check


def _capability(value: Any) -> tuple[int, int]:
    match = _CAPABILITY.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise _bad('must be a string like "8.6" (major.minor)')
    return int(match[1]), int(match[2])


def _link(value: Any) -> str:
    link = _string(value)
    if link not in _LINKS:
        raise _bad("allowed values: " + ", ".join(repr(k) for k in _LINKS), shown=link)
    return link


def _pcie_width(value: Any) -> int:
    width = _whole(1)(value)
    if width not in _PCIE_WIDTHS:
        raise _bad("allowed values: " + ", ".join(str(w) for w in _PCIE_WIDTHS))
    return width


def _cpu_flags(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad("must be a list of strings")
    for flag in value:
        if flag not in CPU_FLAGS_OF_INTEREST:
            allowed = ", ".join(repr(f) for f in sorted(CPU_FLAGS_OF_INTEREST))
            raise _bad(f"allowed values: {allowed}", item=flag)
    return tuple(sorted(set(value)))


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad("must be true or false")
    return value


def _table(written: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, dict):
            raise _bad(f"must be a table, written {written}")
        return value

    return check


def _tables(written: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
            raise _bad(f"must be tables written as {written}")
        return value

    return check


MAX_GPUS_PER_NODE = 64
MAX_NODES = 1024
"""Beyond any machine or cluster this plans for; a typo of 1000 nodes x 1000 GPUs printed 2 million lines."""
Whole1 = Annotated[int, PlainValidator(_whole(1))]
Text = Annotated[str, PlainValidator(_string)]
# Optional keys: absent means None; TOML has no null, so a value given is always checked.
OptionalWhole1 = Annotated[int | None, PlainValidator(_whole(1))]
OptionalText = Annotated[str | None, PlainValidator(_string)]
GiB = Annotated[float, PlainValidator(_gib)]
OptionalGBs = Annotated[float | None, PlainValidator(_positive("GB/s"))]
OptionalTflops = Annotated[float | None, PlainValidator(_positive("TFLOP/s"))]


# --------------------------------------------------------------------------- the file's shape


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GPUTable(_Table):
    """One ``[[node.gpus]]`` table: ``count`` identical GPUs and how they are linked."""

    name: Text
    count: Annotated[int, PlainValidator(_whole(1, MAX_GPUS_PER_NODE))] = 1
    memory_gib: GiB
    compute_capability: Annotated[tuple[int, int], PlainValidator(_capability)]
    link: Annotated[str, PlainValidator(_link)] = "pcie"
    pcie_gen: OptionalWhole1 = None
    pcie_width: Annotated[int | None, PlainValidator(_pcie_width)] = None
    memory_bandwidth_gbs: OptionalGBs = None
    """Peak memory bandwidth from the GPU's spec sheet (the performance model's decode bound)."""
    bf16_tflops: OptionalTflops = None
    """Dense bf16 (fp16 without bf16) tensor TFLOP/s from the spec sheet, without sparsity."""

    def to_gpus(self, first_index: int) -> list[GPUInfo]:
        """The table's GPUs with consecutive indexes from ``first_index``."""
        memory = round(self.memory_gib * GIB)
        return [
            GPUInfo(
                index=first_index + i,
                name=self.name,
                memory_bytes=memory,
                free_bytes=memory,
                compute_capability=self.compute_capability,
                pcie_gen=self.pcie_gen,
                pcie_width=self.pcie_width,
                pcie_gen_max=self.pcie_gen,
                pcie_width_max=self.pcie_width,
                memory_bandwidth_gbs=self.memory_bandwidth_gbs,
                bf16_tflops=self.bf16_tflops,
            )
            for i in range(self.count)
        ]


class NodeTable(_Table):
    """The ``[node]`` table: one machine."""

    cpu_cores: Whole1
    memory_gib: GiB
    numa_nodes: Whole1 = 1
    cpu_flags: Annotated[tuple[str, ...], PlainValidator(_cpu_flags)] = ()
    gpus: Annotated[list[GPUTable], BeforeValidator(_tables("[[node.gpus]]"))] = []
    mps: Annotated[bool | None, PlainValidator(_boolean)] = None
    """NVIDIA's MPS control program is installed; absent: yes where there are GPUs (the Linux
    driver's utilities bring it)."""

    def to_node(self) -> NodeInfo:
        gpus: list[GPUInfo] = []
        pairs: set[tuple[int, int]] = set()
        for table in self.gpus:
            group = table.to_gpus(first_index=len(gpus))
            if table.link == "nvlink":
                pairs.update(combinations([g.index for g in group], 2))
            gpus.extend(group)
        return NodeInfo(
            cpu_cores=self.cpu_cores,
            memory_bytes=round(self.memory_gib * GIB),
            numa_nodes=self.numa_nodes,
            cpu_flags=self.cpu_flags,
            gpus=tuple(gpus),
            nvlink_pairs=frozenset(pairs),
            mps=bool(gpus) if self.mps is None else self.mps,
        )


class ProfileFile(_Table):
    """A whole profile file."""

    name: OptionalText = None
    """Defaults to the file's stem."""
    nodes: Annotated[int, PlainValidator(_whole(1, MAX_NODES))] = 1
    node: Annotated[NodeTable, BeforeValidator(_table("[node]"))]

    def hardware(self, source: str, default_name: str) -> Hardware:
        return Hardware(name=self.name or default_name, source=source, nodes=self.nodes, node=self.node.to_node())


_TABLE_AT: dict[tuple[str, ...], type[BaseModel]] = {
    (): ProfileFile,
    ("node",): NodeTable,
    ("node", "gpus"): GPUTable,
}
"""Which table sits at a location (list positions left out), for the keys an unknown key may be."""


def _first_problem(exc: ValidationError, data: dict[str, Any]) -> str:
    """One line for the first problem as a person reads the file: depth first, and in each table
    its unknown keys (in the file's order) before its known ones (in the order documented)."""
    return _describe(min(exc.errors(), key=lambda error: _reading_order(error["loc"], data)))


def _reading_order(loc: tuple[int | str, ...], data: Any) -> list[tuple[int, int]]:
    order: list[tuple[int, int]] = []
    path: list[str] = []
    for part in loc:
        table = _TABLE_AT.get(tuple(path))
        if isinstance(part, int) or table is None:
            order.append((0, part if isinstance(part, int) else 0))
        elif part in table.model_fields:
            order.append((1, list(table.model_fields).index(part)))
        else:  # an unknown key: checked before the table's known keys
            order.append((0, list(data).index(part) if isinstance(data, dict) and part in data else 0))
        if not isinstance(part, int):
            path.append(part)
        data = _child(data, part)
    return order


def _child(data: Any, part: int | str) -> Any:
    """``data[part]`` where the file has it; None where it has not, or ``data`` is no table or list."""
    if isinstance(data, dict):
        return data.get(part)
    if isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
        return data[part]
    return None


def _describe(error: ErrorDetails) -> str:
    loc = error["loc"]
    key = _dotted(loc)
    if error["type"] == "missing":
        return f"missing required key '{key}'"
    if error["type"] == "extra_forbidden":
        table = _TABLE_AT.get(tuple(str(p) for p in loc[:-1] if not isinstance(p, int)))
        allowed = f"; allowed: {', '.join(table.model_fields)}" if table else ""
        return f"unknown key '{key}'{allowed}"
    ctx = error.get("ctx") or {}
    if "item" in ctx:
        return f"{key} has {ctx['item']!r}: {error['msg']}"
    return f"{key} = {ctx.get('shown', error['input'])!r}: {error['msg']}"


def _dotted(loc: tuple[int | str, ...]) -> str:
    """('node', 'gpus', 0, 'link') -> 'node.gpus[0].link', as the TOML reads."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
