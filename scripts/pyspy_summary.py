"""Where an engine core's time went, from py-spy's raw (collapsed-stack) records.

`gpu-vs-defaults.sh` with PROFILE=1 records each engine core under load. The figure that matters
for issue 12 is the share of samples spent in ``AsyncGPUModelRunnerOutput.get_output``: the engine
core waiting for the GPU to finish the step (CUDA's event wait spins, so it shows as busy CPU). Near
0 % means the host side is the ceiling; a large share means the GPU is on the critical path.

    python3 scripts/pyspy_summary.py FILE [FILE ...]   (plain or .gz)
"""

from __future__ import annotations

import gzip
import sys
from collections import Counter
from pathlib import Path

GPU_WAIT = "get_output ("


def read(path: Path) -> Counter[str]:
    """Samples per innermost frame (py-spy raw: ``frame;frame;... COUNT`` per line)."""
    opener = gzip.open if path.suffix == ".gz" else open
    leaf: Counter[str] = Counter()
    with opener(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if stack and count.isdigit():
                leaf[stack.split(";")[-1]] += int(count)
    return leaf


def summary(path: Path, top: int = 5) -> str:
    leaf = read(path)
    total = sum(leaf.values())
    if not total:
        return f"{path.name}: no samples (the process was idle while py-spy ran)"
    wait = sum(n for frame, n in leaf.items() if GPU_WAIT in frame)
    lines = [f"{path.name}: {total} samples, waiting for the GPU {100 * wait / total:.1f} %"]
    lines += [f"  {100 * n / total:5.1f} %  {frame[:110]}" for frame, n in leaf.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("\n".join(summary(Path(p)) for p in sys.argv[1:]))
