"""The verdicts of ``verify``: pure functions of what was read (log text, NVML readings, timings).

1. The plan's tensor/pipeline/data parallel sizes show in vLLM's start-up log.
2. One process per GPU, and the GPUs' used memory within 10 % of each other (GPU only).
3. Prompts of different lengths, one at a time: first-token jitter (max - min) < 100 ms; all
   at once: GPU-Util > 60 % on every card (GPU only); no NCCL warnings, retries, errors or
   timeouts in the engine log.
4. PCIe generation/width (current and max) and NVLink per GPU; a narrow link is a warning.

Testable without the hardware; what does not apply here (GPU checks on a CPU engine) is a
``skip`` with the reason.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Sequence, Set
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from config.hardware import GIB
from config.plan import Plan

Result = Literal["pass", "fail", "warn", "skip"]

JITTER_MAX_S = 0.100
"""TTFT jitter limit: max - min of the prompts' first-token times (the article's "< 100 ms")."""
GPU_UTIL_MIN = 60.0
"""Per card, mean NVML GPU-Util (%) over the samples taken while all the prompts were in flight."""
GPU_IDLE_MAX = 5.0
"""A card below this while others work is not being used at all: a failed check."""
MEMORY_SPREAD_MAX = 0.10
"""(max - min) / max of the used memory across the plan's GPUs."""
PCIE_FULL_WIDTH = 16
PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
_SHORT = {"tensor_parallel_size": "TP", "pipeline_parallel_size": "PP", "data_parallel_size": "DP"}


@dataclass
class Check:
    """One row of the report."""

    name: str
    result: Result
    measured: str
    threshold: str
    note: str = ""
    value: Any = None
    """The measured value in machine-readable form (``--json``)."""


def overall(checks: Sequence[Check]) -> Result:
    """'fail' if any check failed, else 'warn' if any warned, else 'pass'."""
    results = {c.result for c in checks}
    for verdict in ("fail", "warn"):
        if verdict in results:
            return verdict
    return "pass"


# ============================================================================ 1. the log

_CONFIG_LINE = re.compile(r"with config:")
_CONFIG_SIZE = re.compile(r"\b(tensor_parallel_size|pipeline_parallel_size|data_parallel_size)=(\d+)")
_ARGS_LINE = re.compile(r"non-default args: \{")
_ARGS_SIZE = re.compile(r"'(tensor_parallel_size|pipeline_parallel_size|data_parallel_size)': (\d+)")
_DP_CORE = re.compile(r"\(EngineCore_DP(\d+) pid=\d+\)")


@dataclass
class LogParallel:
    """Parallel sizes as vLLM's start-up log states them."""

    configs: list[dict[str, int]] = field(default_factory=list)
    """Each 'Initializing a V1 LLM engine (vX) with config: ... tensor_parallel_size=N, ...' line."""
    args: dict[str, int] | None = None
    """From the API server's 'non-default args: {...}' line; a size at its default (1) is absent."""
    dp_cores: set[int] = field(default_factory=set)
    """Replica numbers of the engine cores that wrote to the log ('(EngineCore_DP1 pid=...)')."""


def parse_parallel_sizes(log_text: str) -> LogParallel:
    found = LogParallel()
    for line in log_text.splitlines():
        if m := _DP_CORE.match(line):
            found.dp_cores.add(int(m.group(1)))
        if _CONFIG_LINE.search(line):
            sizes = {k: int(v) for k, v in _CONFIG_SIZE.findall(line)}
            if sizes:
                found.configs.append(sizes)
        elif _ARGS_LINE.search(line) and found.args is None:
            found.args = {k: int(v) for k, v in _ARGS_SIZE.findall(line)}
    return found


def check_parallel_sizes(plan: Plan, log_text: str) -> Check:
    """The sizes the engine reports it runs with equal the plan's.

    TP and PP: the engine-config line spells out every size; where it is missing, the
    'non-default args' line, in which an absent size means vLLM's default 1. DP: the engine
    cores that log as ``EngineCore_DP<n>``; a dense model's replicas are independent engines
    and vLLM (0.24) prints ``data_parallel_size=1`` in their config line, so that value is
    not the replica count.
    """
    wanted = {k: getattr(plan, k) for k in PARALLEL_KEYS}
    threshold = "log = plan: " + ", ".join(f"{_SHORT[k]}={v}" for k, v in wanted.items())
    parsed = parse_parallel_sizes(log_text)
    if not parsed.configs and parsed.args is None:
        return Check(
            "parallel sizes in log",
            "fail",
            "not found",
            threshold,
            "no 'with config: ... tensor_parallel_size=' or 'non-default args:' line in the engine log",
        )
    args = parsed.args
    notes: list[str] = []
    measured: dict[str, int | None] = {}
    for key in PARALLEL_KEYS[:2]:
        seen = sorted({c[key] for c in parsed.configs if key in c})
        if len(seen) > 1:
            notes.append(f"engine cores disagree on {_SHORT[key]}: {seen}")
        if seen:
            measured[key] = seen[-1]
            if args is not None and args.get(key, 1) != seen[-1]:
                notes.append(f"non-default args say {_SHORT[key]}={args.get(key, 1)}, the engine config {seen[-1]}")
        else:
            measured[key] = args.get(key, 1) if args is not None else None
    dp = "data_parallel_size"
    if parsed.dp_cores:
        measured[dp] = len(parsed.dp_cores)
    elif args is not None:
        measured[dp] = args.get(dp, 1)
    else:
        measured[dp] = max((c[dp] for c in parsed.configs if dp in c), default=None)
    if args is not None and args.get(dp, 1) != measured[dp]:
        notes.append(f"non-default args say DP={args.get(dp, 1)}, {measured[dp]} engine core(s) logged")
    sources = "TP/PP from the engine config line" if parsed.configs else "from non-default args (absent = 1)"
    if parsed.dp_cores:
        sources += f"; DP from engine cores EngineCore_DP{','.join(map(str, sorted(parsed.dp_cores)))}"
    shown = ", ".join(f"{_SHORT[k]}={'?' if v is None else v}" for k, v in measured.items())
    mismatched = [k for k in PARALLEL_KEYS if measured[k] != wanted[k]]
    if mismatched:
        notes.insert(0, "differs from the plan: " + ", ".join(_SHORT[k] for k in mismatched))
    result: Result = "fail" if mismatched or any("disagree" in n for n in notes) else "pass"
    return Check("parallel sizes in log", result, shown, threshold, "; ".join([sources, *notes]), measured)


# ============================================================================ NCCL in the log

NCCL_PROBLEMS: list[tuple[str, re.Pattern[str]]] = [
    ("NCCL WARN", re.compile(r"NCCL WARN")),
    ("NCCL retry", re.compile(r"NCCL INFO.*\bretry|\bretrying\b.*\bNCCL|NCCL.*\bretrying\b", re.IGNORECASE)),
    ("NCCL error", re.compile(r"NCCL error|nccl(?:Internal|System|Remote|UnhandledCuda|InvalidUsage)Error")),
    (
        "collective timeout",
        re.compile(r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*tim(?:ed|ing) out"),
    ),
]


def find_nccl_problems(log_text: str) -> list[tuple[str, str]]:
    """(kind, line) for every line that shows an NCCL warning, retry, error or timeout."""
    hits: list[tuple[str, str]] = []
    for line in log_text.splitlines():
        for kind, pattern in NCCL_PROBLEMS:
            if pattern.search(line):
                hits.append((kind, line.strip()))
                break
    return hits


def check_nccl(log_text: str, plan: Plan) -> Check:
    hits = find_nccl_problems(log_text)
    threshold = "0 NCCL WARN / retry / error / timeout lines"
    if hits:
        kinds = sorted({k for k, _ in hits})
        return Check(
            "NCCL warnings in log",
            "fail",
            f"{len(hits)} line{'s' if len(hits) > 1 else ''} ({', '.join(kinds)})",
            threshold,
            f"first: {hits[0][1][:200]}",
            len(hits),
        )
    if plan.device == "cpu":
        note = "CPU engine: NCCL is not used; the log was searched anyway"
    elif plan.world_size == 1:
        note = "no TP/PP group on this plan, so little NCCL traffic"
    elif "NCCL_DEBUG" not in plan.environment and "NCCL_DEBUG" not in os.environ:
        note = "NCCL prints WARN/INFO lines only with NCCL_DEBUG=WARN or INFO in the engine's environment"
    else:
        note = ""
    return Check("NCCL warnings in log", "pass", "0 lines", threshold, note, 0)


# ============================================================================ 2. GPU processes and memory


@dataclass
class GPUReading:
    """What NVML says about one of the plan's GPUs."""

    index: int
    """CUDA index (as in the plan)."""
    pids: list[int]
    used_bytes: int
    total_bytes: int


PROCESSES_CHECK = "engine processes per GPU"
MPS_SERVER_COMM = "nvidia-cuda-mps"
"""``/proc/PID/comm`` of NVIDIA's MPS server (``nvidia-cuda-mps-server`` cut to 15 characters)."""


def check_processes(
    readings: Sequence[GPUReading], engine_pids: set[int] | None, per_gpu: int = 1, mps_pids: Set[int] = frozenset()
) -> Check:
    """Exactly the plan's engine processes on every GPU it uses: ``per_gpu`` (its engines_per_gpu; a
    TP/PP group has one worker per GPU). ``mps_pids``: NVIDIA's MPS server, which NVML lists on a GPU
    whose engines share it under MPS, not counted.

    ``engine_pids``: the serve process's descendants, to name foreign processes; None where
    they cannot be known (NVML then reports PIDs from another namespace, as in containers).
    """
    pids = {r.index: [p for p in r.pids if p not in mps_pids] for r in readings}
    counts = {i: len(p) for i, p in pids.items()}
    measured = ", ".join(f"GPU{i}: {n}" for i, n in counts.items())
    notes: list[str] = []
    crowded = [i for i, n in counts.items() if n > per_gpu]
    short = [i for i, n in counts.items() if 0 < n < per_gpu]
    empty = [i for i, n in counts.items() if n == 0]
    result: Result = "pass"
    if crowded:
        result = "fail"
        notes.append(f"more than {per_gpu} on " + ", ".join(f"GPU{i} (pids {pids[i]})" for i in crowded))
    if short:
        result = "fail"
        notes.append(f"fewer than {per_gpu} on " + ", ".join(f"GPU{i} (pids {pids[i]})" for i in short))
    if empty:
        if all(n == 0 for n in counts.values()) and any(r.used_bytes > 0 for r in readings):
            result = "warn" if result == "pass" else result
            notes.append("NVML lists no processes although memory is in use (PIDs in another namespace?)")
        else:
            result = "fail"
            notes.append("no process on " + ", ".join(f"GPU{i}" for i in empty))
    if engine_pids is not None:
        foreign = sorted({p for ps in pids.values() for p in ps} - engine_pids)
        if foreign and len(foreign) < sum(counts.values()):
            notes.append(f"not the engine's: pids {foreign}")
    return Check(PROCESSES_CHECK, result, measured, f"{per_gpu} per GPU", "; ".join(notes), counts)


def check_memory_balance(readings: Sequence[GPUReading]) -> Check:
    """Used memory within MEMORY_SPREAD_MAX of each other across the plan's GPUs."""
    threshold = f"(max-min)/max <= {MEMORY_SPREAD_MAX:.0%}"
    used = {r.index: r.used_bytes for r in readings}
    shown = ", ".join(f"GPU{i}: {b / GIB:.1f} GiB" for i, b in used.items())
    if len(readings) < 2:
        return Check("GPU memory balance", "pass", shown, threshold, "one GPU: nothing to compare", 0.0)
    top = max(used.values())
    spread = (top - min(used.values())) / top if top else 0.0
    result: Result = "pass" if spread <= MEMORY_SPREAD_MAX else "fail"
    note = f"spread {spread:.1%}" + (
        "" if result == "pass" else "; a rank holds more (or another process shares a GPU)"
    )
    return Check("GPU memory balance", result, shown, threshold, note, round(spread, 4))


# ============================================================================ 3. jitter and utilisation


@dataclass
class PromptTiming:
    words: int
    ttft_s: float | None
    error: str | None = None
    resent: int = 0
    """Times the prompt went again under a fresh nonce because its reply had no visible text."""


def check_jitter(timings: Sequence[PromptTiming], path: str) -> Check:
    """First-token time is stable: max - min over the prompts below JITTER_MAX_S."""
    threshold = f"max-min < {JITTER_MAX_S * 1000:.0f} ms"
    bad = [t for t in timings if t.error or t.ttft_s is None]
    ttfts = [t.ttft_s for t in timings if not t.error and t.ttft_s is not None]
    if bad or len(ttfts) < 2:
        first = bad[0].error or "no token streamed" if bad else "fewer than two prompts"
        return Check(
            "TTFT jitter",
            "fail",
            f"{len(bad)} of {len(timings)} prompts failed",
            threshold,
            f"via {path}: {first}",
        )
    jitter = max(ttfts) - min(ttfts)
    note = (
        f"via {path}, {len(ttfts)} prompts of {min(t.words for t in timings)}-{max(t.words for t in timings)} words; "
        f"TTFT min {min(ttfts) * 1000:.0f} / median {statistics.median(ttfts) * 1000:.0f} / "
        f"max {max(ttfts) * 1000:.0f} ms, stdev {statistics.stdev(ttfts) * 1000:.1f} ms"
    )
    words = [t.words for t in timings]
    if len(set(words)) > 1:
        slope = statistics.linear_regression(words, ttfts).slope * 100
        note += f", {slope * 1000:+.1f} ms per 100 words (prefill)"
    if resent := sum(t.resent for t in timings):
        note += f"; {resent} resent under a fresh nonce (a reply with no visible text)"
    result: Result = "pass" if jitter < JITTER_MAX_S else "fail"
    value = round(jitter, 4)  # what is shown comes from the value kept, so the two never disagree by a rounding
    return Check("TTFT jitter", result, f"{value * 1000:.0f} ms", threshold, note, value)


def check_utilisation(load: dict[int, list[float]], one_at_a_time: dict[int, list[float]] | None = None) -> Check:
    """Mean GPU-Util per card with all the prompts in flight; every card above GPU_UTIL_MIN.

    Judged under load, not one prompt at a time: with replicas, a lone request keeps only
    one card busy, and a small model's single stream leaves any GPU waiting on the CPU.
    The one-at-a-time figures are given in the note.
    """
    threshold = f"> {GPU_UTIL_MIN:.0f} % each card"
    means = {i: statistics.fmean(s) for i, s in load.items() if s}
    unsampled = [i for i, s in load.items() if not s]
    shown = ", ".join(f"GPU{i}: {m:.0f} %" for i, m in means.items()) or "no samples"
    notes = []
    if one_at_a_time and all(one_at_a_time.values()):
        singles = ", ".join(f"GPU{i}: {statistics.fmean(s):.0f} %" for i, s in one_at_a_time.items())
        notes.append(f"one prompt at a time: {singles}")
    if unsampled:
        notes.insert(0, "no NVML samples for " + ", ".join(f"GPU{i}" for i in unsampled))
        return Check("GPU utilisation", "warn", shown, threshold, "; ".join(notes))
    low = [i for i, m in means.items() if m <= GPU_UTIL_MIN]
    idle = [i for i, m in means.items() if m < GPU_IDLE_MAX]
    notes.insert(0, f"all prompts at once, mean of {min(len(s) for s in load.values())}+ samples per card")
    result: Result = "pass"
    if idle and len(idle) < len(means):
        result = "fail"
        notes.append("idle: " + ", ".join(f"GPU{i}" for i in idle) + " does no work while the others do")
    elif low:
        # Measured on 2 x H200 with the 0.36 B model: every layout stays below 60 % because the
        # host CPU (API server, scheduler) sets the pace, not the GPU (BENCHMARKS.md).
        result = "warn"
        notes.append(
            "low on " + ", ".join(f"GPU{i}" for i in low) + ": the GPUs wait on the host CPU "
            "(a small model) or on each other; the article's 60 % assumes a GPU-bound model"
        )
    value = {i: round(m, 1) for i, m in means.items()}
    return Check("GPU utilisation", result, shown, threshold, "; ".join(notes), value)


# ============================================================================ 4. links


@dataclass
class LinkReading:
    index: int
    pcie_gen: int | None
    pcie_width: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    nvlink_peers: list[int]
    """CUDA indexes of the plan's other GPUs this one reaches over NVLink."""
    under_load: bool = False
    """Current gen/width read while prompts ran (an idle GPU trains its link down)."""


def check_link(reading: LinkReading, others: Sequence[int]) -> Check:
    """PCIe gen/width against the maximum and x16, and NVLink to the plan's other GPUs."""
    r = reading

    def figure(gen: int | None, width: int | None) -> str:
        return f"gen{gen or '?'} x{width or '?'}"

    nv = f"NVLink to {', '.join(f'GPU{p}' for p in r.nvlink_peers)}" if r.nvlink_peers else "no NVLink"
    measured = f"PCIe {figure(r.pcie_gen, r.pcie_width)} (max {figure(r.pcie_gen_max, r.pcie_width_max)}), {nv}"
    threshold = f"width x{PCIE_FULL_WIDTH}, gen = max"
    narrow: list[str] = []
    if r.pcie_width is not None and r.pcie_width < PCIE_FULL_WIDTH:
        narrow.append(f"width x{r.pcie_width} < x{PCIE_FULL_WIDTH}")
    elif r.pcie_width is not None and r.pcie_width_max is not None and r.pcie_width < r.pcie_width_max:
        narrow.append(f"width x{r.pcie_width} below its max x{r.pcie_width_max}")
    if r.pcie_gen is not None and r.pcie_gen_max is not None and r.pcie_gen < r.pcie_gen_max:
        narrow.append(
            f"gen{r.pcie_gen} below its max gen{r.pcie_gen_max}" + ("" if r.under_load else " (read at idle)")
        )
    missing = [p for p in others if p not in r.nvlink_peers]
    notes = list(narrow)
    if narrow:
        notes.append("NCCL over this link will be slow; reseat the card or use an x16 slot")
    if missing and narrow:
        notes.append("no NVLink to " + ", ".join(f"GPU{p}" for p in missing) + ": TP traffic crosses this PCIe link")
    if r.pcie_gen is None and r.pcie_width is None:
        notes.append("NVML does not report the PCIe link of this GPU")
    value = asdict(r)
    return Check(f"link GPU{r.index}", "warn" if narrow else "pass", measured, threshold, "; ".join(notes), value)


# ============================================================================ the report


@dataclass
class Report:
    engine: str
    plan: str
    path: str
    checks: list[Check]

    @property
    def overall(self) -> Result:
        return overall(self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "plan": self.plan,
            "path": self.path,
            "overall": self.overall,
            "checks": [asdict(c) for c in self.checks],
        }


def skip(name: str, threshold: str, why: str) -> Check:
    return Check(name, "skip", "-", threshold, why)


def gpu_skips(why: str) -> list[Check]:
    return [
        skip(PROCESSES_CHECK, "the plan's engines_per_gpu", why),
        skip("GPU memory balance", f"(max-min)/max <= {MEMORY_SPREAD_MAX:.0%}", why),
        skip("GPU utilisation", f"> {GPU_UTIL_MIN:.0f} % each card", why),
        skip("links (PCIe/NVLink)", f"width x{PCIE_FULL_WIDTH}, gen = max", why),
    ]
