"""Does a second process on the same GPU slow the first one's small steps, and does MPS help?

Two engines on one H200 lose at 16 users (each step waits for the other's) and win at 256 (the
host side is the ceiling). This mimics one engine's decode step without vLLM: a CUDA graph of
18 layers of batch-64 matmuls (the 0.36 B shape), then ``gap_ms`` of host work, in a loop. It
runs one process alone, then two at once, with and without the gap, and prints steps/s per
process as JSON lines. ``bash`` around it starts an MPS daemon for the second pass when the
host has one (scripts/gpu-mps-probe.sh).

    python3 scripts/mps_probe.py worker START_EPOCH ROLE   # ROLE 0 or 1; phases from START_EPOCH
"""

from __future__ import annotations

import json
import sys
import time

PHASES = (("alone", 3.0, False), ("pair", 3.0, True), ("alone", 0.0, False), ("pair", 0.0, True))
"""(name, host gap per step in ms, whether the second process runs too)."""
PHASE_S = 4.0
SETTLE_S = 0.5
BATCH, HIDDEN, FFN, LAYERS = 64, 1024, 3072, 18


def step_graph() -> object:
    """One decode step's matmuls as a CUDA graph (what vLLM replays per step)."""
    import torch

    dev = torch.device("cuda")
    x = torch.randn(BATCH, HIDDEN, device=dev, dtype=torch.bfloat16)
    qkv = torch.randn(HIDDEN, HIDDEN + 2 * 256, device=dev, dtype=torch.bfloat16)
    out = torch.randn(HIDDEN, HIDDEN, device=dev, dtype=torch.bfloat16)
    up = torch.randn(HIDDEN, 2 * FFN, device=dev, dtype=torch.bfloat16)
    down = torch.randn(FFN, HIDDEN, device=dev, dtype=torch.bfloat16)

    def layers() -> None:
        h = x
        for _ in range(LAYERS):
            a = (h @ qkv)[:, :HIDDEN] @ out
            g = a @ up
            h = torch.nn.functional.silu(g[:, :FFN]) * g[:, FFN:] @ down
        x.copy_(h * 1e-3)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            layers()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers()
    return graph


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def worker(start: float, role: int) -> None:
    import torch

    graph = step_graph()
    for i, (name, gap_ms, both) in enumerate(PHASES):
        begin = start + i * (PHASE_S + SETTLE_S)
        time.sleep(max(0.0, begin - time.time()))
        if role == 1 and not both:
            continue
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < PHASE_S:
            graph.replay()  # type: ignore[attr-defined]
            torch.cuda.synchronize()
            spin(gap_ms)
            steps += 1
        elapsed = time.perf_counter() - t0
        row = {"phase": name, "gap_ms": gap_ms, "role": role, "steps_per_s": round(steps / elapsed, 1)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "worker":
        sys.exit(__doc__)
    worker(float(sys.argv[2]), int(sys.argv[3]))
