"""Medians, spread and a PNG of one `vs-defaults.sh` run, from its `vllm bench serve` JSONs.

Reads NAME-cC-rR.json (the measured runs; not the warm level or the profile's runs), prints one
JSON object per server and level (runs, median output tok/s, p99 TTFT range, median TPOT) and
writes vs-defaults.png beside them: median tok/s per level, the bars' whiskers the slowest and
fastest run.

    .venv/bin/python benchmarks/vs_defaults_summary.py OUT
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

RUN = re.compile(r"(?P<name>[\w.]+)-c(?P<level>\d+)-r(?P<run>\d+)\.json$")


def summarise(folder: Path) -> list[dict[str, Any]]:
    """One record per (server, level), servers in the order their files sort."""
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    for path in sorted(folder.glob("*-c*-r*.json")):
        m = RUN.search(path.name)
        if m:
            runs.setdefault((m["name"], int(m["level"])), []).append(json.loads(path.read_text()))
    out: list[dict[str, Any]] = []
    for (name, level), found in sorted(runs.items()):
        tok = [r["output_throughput"] for r in found]
        p99 = [r["p99_ttft_ms"] for r in found]
        out.append(
            {
                "server": name,
                "concurrency": level,
                "tok_s": [round(t) for t in tok],
                "median_tok_s": round(statistics.median(tok)),
                "p99_ttft_ms": [round(min(p99)), round(max(p99))],
                "median_tpot_ms": round(statistics.median(r["median_tpot_ms"] for r in found), 2),
            }
        )
    return out


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(dict.fromkeys(r["server"] for r in records))
    levels = sorted({r["concurrency"] for r in records})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(servers)
    for i, name in enumerate(servers):
        mine = {r["concurrency"]: r for r in records if r["server"] == name}
        xs = [j + i * width for j, level in enumerate(levels) if level in mine]
        medians = [mine[level]["median_tok_s"] for level in levels if level in mine]
        runs = [mine[level]["tok_s"] for level in levels if level in mine]
        low = [m - min(r) for m, r in zip(medians, runs, strict=True)]
        high = [max(r) - m for m, r in zip(medians, runs, strict=True)]
        ax.bar(xs, medians, width, yerr=[low, high], capsize=4, label=name)
    ax.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(levels))], [f"{c} concurrent" for c in levels])
    ax.set_ylabel("output tokens/s (median; whiskers: slowest, fastest run)")
    ax.set_title(path.parent.name, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    folder = Path(sys.argv[1])
    records = summarise(folder)
    for record in records:
        print(json.dumps(record))
    plot(records, folder / "vs-defaults.png")


if __name__ == "__main__":
    main()
