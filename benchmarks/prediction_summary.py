"""The performance model against `bench`, from cpu-prediction.sh's results: per plan and level the measured
median (slowest-fastest) of every run, and each source of costs' prediction with its signed error; how many
measured figures fell inside each source's band.

    .venv/bin/python benchmarks/prediction_summary.py bench-results/cpu-prediction
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

FIGURES = ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms")


def main(root: Path) -> None:
    measured: dict[tuple[str, int], list[dict[str, float]]] = defaultdict(list)
    predicted: dict[tuple[str, int, str], dict[str, dict[str, float]]] = {}
    inside, total = Counter[str](), Counter[str]()
    for path in sorted(root.glob("*-bench-*/bench.json")):
        plan, _, _, source = path.parent.name.split("-", 3)
        for row in json.loads(path.read_text())["results"]:
            level, expected = row["concurrency"], row["expected"]
            measured[(plan, level)].append({k: row[k] for k in FIGURES})
            predicted[(plan, level, source)] = {k: expected["predicted"][k] for k in FIGURES}
            for ok in expected["inside"].values():
                total[source] += 1
                inside[source] += bool(ok)
    for (plan, level), runs in sorted(measured.items()):
        median = {k: statistics.median(r[k] for r in runs) for k in FIGURES}
        speeds = [r["output_tokens_per_s"] for r in runs]
        line = (
            f"{plan} {level:>2} users: measured {median['output_tokens_per_s']:,.0f} tok/s ({min(speeds):,.0f}-"
            f"{max(speeds):,.0f}), TTFT p50 {median['ttft_p50_ms']:.1f} ms, TPOT p50 {median['tpot_p50_ms']:.2f} ms"
        )
        for (p, c, source), fig in sorted(predicted.items()):
            if (p, c) == (plan, level):
                tok = fig["output_tokens_per_s"]
                errors = ", ".join(f"{k.split('_')[0]} {fig[k]['point'] / median[k] - 1:+.0%}" for k in FIGURES)
                line += f"\n    {source:9} {tok['point']:,.0f} ({tok['low']:,.0f}-{tok['high']:,.0f}): {errors}"
        print(line)
    print("measured figures inside the band: " + ", ".join(f"{s} {inside[s]}/{total[s]}" for s in sorted(total)))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
