"""Why the engine's first requests after ``ready:`` can cost more on a GPU host (issue 15).

Against a running engine (``serve`` printed ``ready:``), with the project's own client
(``startup_bench.path_request``, as ``bench-startup`` sends them), every request logged raw with its send time:

1. ``first``: every path's first request, in ``--order`` (sampled paths first, as ``bench-startup``
   sends them, or greedy first), then three more of each (``steady``);
2. ``again``: the same pass straight after (a first-pass effect shows as ``first`` slow, ``again`` not);
3. ``pause-G``: after G seconds idle, four page-path requests (chat, streamed, sampled), 3 times per G.

``nvidia-smi -lms 50`` runs beside it from the shell (``scripts/gpu-warmth.sh``), so each request can
be read against the GPU clock it ran at (the host's cores report a fixed clock on these VMs).
Writes ``requests.jsonl`` under OUT_DIR; ``summary`` reads them back.

    PYTHONPATH=. python3 scripts/warmth_probe.py run BASE_URL MODEL OUT_DIR --order sampled|greedy
    python3 scripts/warmth_probe.py summary OUT_DIR...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import TextIO

import httpx

from backend.engine_api import KINDS, Kind
from backend.measure.startup_bench import path_request

PAUSES_S = (1.0, 3.0, 10.0)


async def probe(base_url: str, model: str, out: Path, order: str) -> None:
    kinds = list(KINDS) if order == "sampled" else [k for k in KINDS if not k.sampled] + [k for k in KINDS if k.sampled]
    with open(out / "requests.jsonl", "w") as log:
        await _passes(base_url, model, kinds, log)


async def _passes(base_url: str, model: str, kinds: list[Kind], log: TextIO) -> None:
    page = KINDS[0]
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0)) as client:
        (await client.get(f"{base_url}/models")).raise_for_status()

        async def one(phase: str, kind: Kind) -> None:
            t = time.time()
            res = await path_request(client, base_url, model, kind)
            row = {"phase": phase, "kind": kind.name, "t": round(t, 3), "ttft_ms": round((res.ttft_s or 0) * 1e3, 2)}
            row["total_ms"] = round((res.total_s or 0) * 1e3, 2)
            log.write(json.dumps(row) + "\n")
            log.flush()  # a device call cut at its limit keeps every request sent

        for phase in ("first", "again"):
            for kind in kinds:
                await one(phase, kind)
            for kind in kinds:
                for _ in range(3):
                    await one(f"{phase}-steady", kind)
        for gap in PAUSES_S:
            for _ in range(3):
                await asyncio.sleep(gap)
                for _ in range(4):
                    await one(f"pause-{gap:g}", page)


def summary(dirs: list[Path]) -> None:
    """Per start: each path's first request over the median of its next three (``first``, and the
    same pass sent again at once: ``again``), and each pause's first request over the next three;
    with the SM clocks nvidia-smi saw meanwhile."""
    for d in dirs:
        rows = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines()]
        smi = (d / "gpu-clocks.csv").read_text().splitlines()
        clocks = {line.split(",")[1].strip() for line in smi if line.count(",") >= 4}
        print(f"{d.name} (SM clocks seen, MHz: {', '.join(sorted(clocks))})")
        for phase in ("first", "again"):
            ratios = []
            for kind in dict.fromkeys(r["kind"] for r in rows):
                first = next(r["ttft_ms"] for r in rows if r["phase"] == phase and r["kind"] == kind)
                steady = statistics.median(
                    r["ttft_ms"] for r in rows if r["phase"] == f"{phase}-steady" and r["kind"] == kind
                )
                ratios.append(f"{kind} x{first / steady:.2f}")
            print(f"  {phase}: " + ", ".join(ratios))
        for gap in PAUSES_S:
            ttfts = [r["ttft_ms"] for r in rows if r["phase"] == f"pause-{gap:g}"]
            rounds = [ttfts[i : i + 4] for i in range(0, len(ttfts), 4)]
            print(f"  after {gap:g} s idle: " + ", ".join(f"x{r[0] / statistics.median(r[1:]):.2f}" for r in rounds))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("base_url")
    run.add_argument("model")
    run.add_argument("out", type=Path)
    run.add_argument("--order", choices=("sampled", "greedy"), default="sampled")
    sub.add_parser("summary").add_argument("dirs", type=Path, nargs="+")
    a = ap.parse_args()
    if a.cmd == "summary":
        summary(a.dirs)
        return
    a.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(probe(a.base_url.rstrip("/"), a.model, a.out, a.order))


if __name__ == "__main__":
    main()
