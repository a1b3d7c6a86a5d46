"""What one engine step does on the GPU, from vLLM's torch-profiler traces (one file per engine).

`vs-defaults.sh` with TRACE=1 starts the plan's engines with ``--profiler-config`` (torch,
no stacks, the front end left out) and, under load, has each engine record a few dozen steps: what
the GPU does in a step, and whether the engines sharing it overlap or queue (BENCHMARKS.md, "Three
engines per GPU"). Per trace this prints:

- steps: vLLM's per-step annotation (``execute_context_N(..)_generation_M(..)``: N requests
  reading a prompt, M decoding), their count, the median period between step starts, and the
  median of each ``gpu_model_runner:`` phase on the host (needs VLLM_CUSTOM_SCOPES_FOR_PROFILING=1);
- the device: the share of the traced window in which any kernel of this engine runs, kernels
  and CUDA graph launches per step, and the kernels that take the most time;

and over all traces together (the engines sharing one GPU): the share of the common window in
which any engine's kernel runs, and in which two run at once. With ``--png FILE`` it draws each
engine's kernels over the first few milliseconds of the common window: a GPU timeline of steps.

    .venv/bin/python benchmarks/trace_summary.py [--png FILE] TRACE.json.gz [TRACE ...]
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEP = re.compile(r"^execute_context_(\d+)\(\d+\)_generation_(\d+)\(\d+\)$")
PHASE_PREFIX = "gpu_model_runner: "
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
GRAPH_LAUNCH = "cudaGraphLaunch"
Span = tuple[float, float]


@dataclass
class EngineTrace:
    """One engine's trace, its times in microseconds on the host's clock."""

    name: str
    steps: list[tuple[float, int, int]] = field(default_factory=list)
    """(start, requests reading a prompt, requests decoding) per step."""
    phases: dict[str, list[float]] = field(default_factory=dict)
    device: list[Span] = field(default_factory=list)
    kernels: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Total microseconds per kernel name."""
    graph_launches: int = 0


def load(path: Path) -> EngineTrace:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    base = data.get("baseTimeNanoseconds", 0) / 1000  # absolute microseconds, comparable between traces
    trace = EngineTrace(path.name)
    for e in data.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        name, cat = e.get("name", ""), e.get("cat", "")
        start, dur = base + float(e["ts"]), float(e.get("dur", 0))
        if cat in DEVICE_CATS:
            trace.device.append((start, start + dur))
            trace.kernels[name] += dur
        elif cat == "cuda_runtime" and name == GRAPH_LAUNCH:
            trace.graph_launches += 1
        elif cat == "user_annotation" and (m := STEP.match(name)):
            trace.steps.append((start, int(m[1]), int(m[2])))
        elif cat == "user_annotation" and name.startswith(PHASE_PREFIX):
            trace.phases.setdefault(name.removeprefix(PHASE_PREFIX), []).append(dur)
    trace.steps.sort()
    trace.device.sort()
    return trace


def merge(spans: list[Span]) -> list[Span]:
    """Sorted, non-overlapping spans covering the same time."""
    out: list[Span] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered(spans: list[Span], window: Span) -> float:
    """Microseconds of ``window`` that merged ``spans`` cover."""
    lo, hi = window
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans)


def window_of(trace: EngineTrace) -> Span | None:
    """From the first to the last step start (else the device spans' extent)."""
    if len(trace.steps) >= 2:
        return trace.steps[0][0], trace.steps[-1][0]
    if trace.device:
        return trace.device[0][0], max(e for _, e in trace.device)
    return None


def engine_summary(trace: EngineTrace, top: int = 8) -> dict[str, Any]:
    out: dict[str, Any] = {"trace": trace.name, "steps": len(trace.steps)}
    window = window_of(trace)
    steps = max(len(trace.steps) - 1, 1)  # the window runs from the first step's start to the last's
    if len(trace.steps) >= 2:
        starts = [s for s, _, _ in trace.steps]
        out["step_period_ms"] = round(statistics.median(b - a for a, b in itertools.pairwise(starts)) / 1000, 3)
        out["steps_reading_a_prompt"] = sum(1 for _, ctx, _ in trace.steps if ctx)
        out["median_decoding"] = statistics.median(gen for _, _, gen in trace.steps)
    out["host_phase_ms"] = {k: round(statistics.median(v) / 1000, 3) for k, v in sorted(trace.phases.items())}
    if not trace.device:
        out["device"] = "no kernels in the trace (a CPU engine, or the GPU's activities were not recorded)"
        return out
    busy = merge(trace.device)
    assert window is not None
    in_window = [(s, e) for s, e in trace.device if s >= window[0] and s < window[1]]
    out["gpu_busy_pct"] = round(100 * covered(busy, window) / max(window[1] - window[0], 1e-9), 1)
    out["gpu_ms_per_step"] = round(covered(busy, window) / steps / 1000, 3)
    out["kernels_per_step"] = round(len(in_window) / steps, 1)
    out["graph_launches_per_step"] = round(trace.graph_launches / max(len(trace.steps), 1), 2)
    total = sum(trace.kernels.values()) or 1.0
    costliest = sorted(trace.kernels.items(), key=lambda kv: -kv[1])[:top]
    out["top_kernels"] = [{"name": n[:90], "share_pct": round(100 * us / total, 1)} for n, us in costliest]
    return out


def shared_summary(traces: list[EngineTrace]) -> dict[str, Any] | None:
    """Any engine's kernel running, and two at once, over the window all traces cover."""
    windows = [w for t in traces if t.device and (w := window_of(t))]
    if len(windows) < 2:
        return None
    common = (max(w[0] for w in windows), min(w[1] for w in windows))
    if common[1] <= common[0]:
        return {"note": "the traces do not overlap in time: record them under the same load, together"}
    merged = [merge(t.device) for t in traces if t.device]
    length = common[1] - common[0]
    any_busy = covered(merge([s for m in merged for s in m]), common)
    per_engine = sum(covered(m, common) for m in merged)
    return {
        "common_window_ms": round(length / 1000, 2),
        "any_engine_busy_pct": round(100 * any_busy / length, 1),
        "two_at_once_pct": round(100 * (per_engine - any_busy) / length, 1),  # exact for two engines
    }


def plot(traces: list[EngineTrace], path: Path, span_ms: float = 20.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_device = [t for t in traces if t.device]
    if not with_device:
        return
    t0 = max(t.device[0][0] for t in with_device)
    fig, ax = plt.subplots(figsize=(12, 1 + 0.8 * len(with_device)))
    for lane, t in enumerate(with_device):
        shown = [(max(s, t0), e) for s, e in merge(t.device) if e > t0 and s - t0 < span_ms * 1000]
        bars = [((s - t0) / 1000, (e - s) / 1000) for s, e in shown]
        ax.broken_barh(bars, (lane - 0.35, 0.7), color=f"C{lane}")
        starts = [(s - t0) / 1000 for s, _, _ in t.steps if 0 <= s - t0 < span_ms * 1000]
        ax.vlines(starts, lane - 0.45, lane + 0.45, colors="k", linewidth=0.6)
    ax.set_yticks(range(len(with_device)), [t.name[:40] for t in with_device])
    ax.set_xlim(0, span_ms)
    ax.set_xlabel("ms (bars: kernels running; ticks: a step starts on the host)")
    ax.set_title("The GPU over one stretch of steps, per engine")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--png", type=Path, help="draw each engine's kernels over the first 20 ms")
    args = parser.parse_args()
    traces = [load(p) for p in args.traces]
    for t in traces:
        print(json.dumps(engine_summary(t)))
    if (shared := shared_summary(traces)) is not None:
        print(json.dumps({"all_traces": shared}))
    if args.png:
        plot(traces, args.png)


if __name__ == "__main__":
    main()
