"""Start-up and reply TTFT: PP=2 over two local "nodes" (mp executor) against one process.

    .venv/bin/python -m backend.measure.multinode_bench [--rounds 2] [--requests 10] [--out FILE]

Each round starts the demo model both ways with the project's own ``serve`` (the layout of
tests/runtime/test_multinode.py: head + ``serve --node-rank 1 --head``, each node bound to
one of the host's cores), times launch to ``ready:`` (plan, start, warm-up), then streams
``--requests`` chat replies of 32 tokens one after another through the API (TTFT, and tokens/s
after the first) and stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from backend.engine_api import chat
from backend.errors import MeasureError
from backend.runtime.processes.process import free_port

ROOT = Path(__file__).resolve().parents[2]
PROFILE = (
    'name = "2 CPU nodes on one host"\nnodes = 2\n[node]\ncpu_cores = 1\nmemory_gib = 8\n'
    'cpu_flags = ["avx2", "avx512f"]\n'
)


def start(argv: list[str], run_dir: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ERNIECHAT_")}
    env.update(ERNIECHAT_ENGINE__RUN_DIR=str(run_dir), PYTHONUNBUFFERED="1")
    log = open(run_dir.with_suffix(".out"), "w")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(
        [sys.executable, "-m", "backend", *argv], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
    )


def wait_ready(run_dir: Path, procs: list[subprocess.Popen[str]], timeout: float = 900) -> None:
    out = run_dir.with_suffix(".out")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(line.startswith("ready:") for line in out.read_text().splitlines()):
            return
        if any(p.poll() is not None for p in procs):
            raise MeasureError(f"exited before ready:\n{out.read_text()[-3000:]}")
        time.sleep(0.2)
    raise MeasureError("not ready in time")


def ttfts(port: int, n: int) -> tuple[list[float], list[float]]:
    """TTFT of each of ``n`` streamed replies of 32 tokens, and its tokens/s after the first."""

    async def go() -> tuple[list[float], list[float]]:
        found, rates = [], []
        async with httpx.AsyncClient(timeout=300) as http:
            for _ in range(n):
                messages = [{"role": "user", "content": "Hello there, how are you?"}]
                r = await chat(http, f"http://127.0.0.1:{port}/v1", "demo", messages, extra={"min_tokens": 32})
                if not r.ok or r.ttft_s is None:
                    raise MeasureError(f"a reply failed: {r.error}")
                found.append(r.ttft_s)
                rates.append((r.tokens - 1) / (r.total_s - r.ttft_s))
        return found, rates

    return asyncio.run(go())


def run(kind: str, tmp: Path, requests: int) -> dict[str, float]:
    port, master = free_port(), free_port()
    head_dir = tmp / f"{kind}-head"
    argv = ["serve", "--model", "demo", "--engine-port", str(port), "--users", "2"]
    if kind == "pp2":
        profile = tmp / "2node.toml"
        profile.write_text(PROFILE)
        argv += ["--hardware", str(profile), "--set", "pipeline_parallel_size=2"]
        argv += ["--master-addr", "127.0.0.1", "--master-port", str(master)]
    t0 = time.monotonic()
    procs = [start(argv, head_dir)]
    if kind == "pp2":
        procs.append(start(["serve", "--node-rank", "1", "--head", f"127.0.0.1:{master + 1}"], tmp / f"{kind}-worker"))
    try:
        wait_ready(head_dir, procs)
        ready = time.monotonic() - t0
        got, rates = ttfts(port, requests)
    finally:
        procs[0].send_signal(signal.SIGINT)
        for p in procs:
            p.wait(180)
    return {
        "ready_s": round(ready, 1),
        "ttft_p50_ms": round(statistics.median(got) * 1000, 1),
        "ttft_max_ms": round(max(got) * 1000, 1),
        "decode_tok_s_p50": round(statistics.median(rates), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for kind in ("single", "pp2"):
                res: dict[str, object] = {
                    "round": i,
                    "kind": kind,
                    "load_before": os.getloadavg()[0],
                    **run(kind, Path(tmp), args.requests),
                }
                print(json.dumps(res), flush=True)
                results.append(res)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
