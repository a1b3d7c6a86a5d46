"""Spread one load level over several client processes, so the client is never the bottleneck.

One Python process parsing a server-sent event per token streams about 10,000 tokens/s;
a 0.36 B model on one H200 serves more than that at 32 concurrent, so a single-process bench
measures its own ceiling (on 2 x H200 every layout landed near 10,000 tok/s and the ranking
flipped between runs). Here each process runs a share of the concurrency and of the requests;
all start together (a barrier after their imports and their own set-up, such as opening the
page's tabs) and the parent merges what they measured.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend.engine_api import ChatResult
from backend.errors import MeasureError

STREAMS_PER_PROCESS = 8
"""Fewer concurrent streams than this per process are not worth a process."""
MAX_PROCESSES = 8
START_TIMEOUT_S = 120.0
"""Spawned processes import the project and set up (a page level opens its tabs): seconds
before the barrier gives up."""


@dataclass
class Span:
    """What one client process measured: its results and when its load began and ended."""

    results: list[ChatResult] = field(default_factory=list)
    start: float = 0.0
    """time.perf_counter() when the first request was sent (CLOCK_MONOTONIC: one clock for all processes)."""
    end: float = 0.0
    cut_off: int = 0
    cpu_s: float = 0.0
    """CPU seconds the process spent while measuring (all processes', for a merged span)."""
    parts: list[Span] = field(default_factory=list)
    """The processes' own spans, when this one merges several."""

    @property
    def busy(self) -> float:
        """Share of the span the client process was on the CPU: near 1 means the client was the limit.

        A merged span: the busiest process's share (one saturated process limits its streams).
        """
        if self.parts:
            return max(p.busy for p in self.parts)
        wall = self.end - self.start
        return self.cpu_s / wall if wall > 0 else 0.0


def client_processes(concurrency: int, cpus: int | None = None) -> int:
    """How many client processes a level gets: one per 8 streams, a quarter of the cores at most.

    On a 2-core machine (CI) always 1: the engine needs those cores more than the client.
    """
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(1, min(concurrency // STREAMS_PER_PROCESS, cpus // 4, MAX_PROCESSES))


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal shares, larger first (16 in 3: 6, 5, 5)."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def merge(spans: list[Span]) -> Span:
    """One span over all processes: first start to last end, all results, and the spans themselves."""
    return Span(
        results=[r for s in spans for r in s.results],
        start=min(s.start for s in spans),
        end=max(s.end for s in spans),
        cut_off=sum(s.cut_off for s in spans),
        cpu_s=sum(s.cpu_s for s in spans),
        parts=list(spans),
    )


Ready = Callable[[], None]
"""What a job calls once set up: it returns when every process is set up (the start line)."""
JobFn = Callable[[dict[str, Any], Ready], Span]


STOPPED_AT_START = "BrokenBarrierError"
"""How a process reports that another one failed before the start (it then stops too)."""


def _child(fn: JobFn, job: dict[str, Any], barrier: Any, out: Any) -> None:
    try:
        out.put(fn(job, lambda: barrier.wait(START_TIMEOUT_S)))
    except BaseException as err:  # the parent must hear of every failure, not wait for it
        out.put(f"{type(err).__name__}: {err}")
        barrier.abort()  # nor the other processes at the start line (they report after this one)


def fan_out(fn: JobFn, jobs: list[dict[str, Any]], timeout_s: float) -> list[Span]:
    """Run ``fn(job, ready)`` for every job in its own spawned process, all starting at once:
    ``fn`` sets up, calls ``ready()`` (which returns when every process has), then measures.

    ``fn`` must be importable (a module-level function). Raises RuntimeError when a process
    fails or gives no answer within ``timeout_s`` after the start.
    """
    ctx = multiprocessing.get_context("spawn")  # no fork: the parent runs threads and an event loop
    barrier = ctx.Barrier(len(jobs))
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, job, barrier, out), daemon=True) for job in jobs]
    for p in procs:
        p.start()
    spans: list[Span] = []
    errors: list[str] = []
    try:
        for _ in procs:
            got = out.get(timeout=START_TIMEOUT_S + timeout_s)
            if isinstance(got, Span):
                spans.append(got)
            else:
                errors.append(got)
    except queue.Empty:
        errors.append(f"a client process gave no result within {START_TIMEOUT_S + timeout_s:.0f} s")
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    failed = [e for e in errors if not e.startswith(STOPPED_AT_START)] or errors
    if errors:
        raise MeasureError(f"load generation failed in {len(failed)} of {len(jobs)} client processes: {failed[0]}")
    return spans
