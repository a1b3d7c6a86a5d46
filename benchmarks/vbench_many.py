"""Several `vllm bench serve` runs in one process (vLLM's own client, the same
code as the CLI), so each run does not pay the ~10 s import of vLLM again. Random 512-token
prompts, 128-token replies, ``--ignore-eos``, max(32, 4 x C) requests per run; run R uses seed
crc32(R), so every server meets the same prompts and no run meets the previous run's prompts in the
prefix cache. One line per run on stdout (and appended to RES/summary.txt), the JSON in RES.

    .venv-engine/bin/python benchmarks/vbench_many.py RES TOKENIZER NAME URL SERVED C:RUN [C:RUN ...]

NAME, URL and SERVED may each be a comma-separated list of the same length: several servers, each run
(C:RUN) measured on every one of them in turn before the next, so that no server always meets the
machine in one state. With VBENCH_DEADLINE (seconds since the epoch) set, runs that would start after it
are listed as skipped instead.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import zlib
from pathlib import Path


def one(res: Path, tokenizer: str, name: str, url: str, served: str, c: int, run: str) -> str:
    from vllm.benchmarks.serve import add_cli_args, main

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    n = max(32, 4 * c)
    file = f"{name}-c{c}-r{run}.json"
    argv = [
        "--base-url", url, "--model", served, "--tokenizer", tokenizer, "--dataset-name", "random",
        "--random-input-len", "512", "--random-output-len", "128", "--ignore-eos",
        "--num-prompts", str(n), "--max-concurrency", str(c), "--seed", str(zlib.crc32(run.encode()) % 10**6),
        "--save-result", "--result-dir", str(res), "--result-filename", file,
    ]  # fmt: skip
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            main(parser.parse_args(argv))
    except Exception as err:  # one failed run must not end the others
        (res / f"{name}-c{c}-r{run}.log").write_text(log.getvalue() + f"\n{type(err).__name__}: {err}\n")
        return f"{name:9} c={c:>3} run {run}: failed: {type(err).__name__}: {str(err)[:200]}"
    (res / f"{name}-c{c}-r{run}.log").write_text(log.getvalue())
    d = json.loads((res / file).read_text())
    return (
        f"{name:9} c={c:>3} run {run}: {d['output_throughput']:8.0f} tok/s, TTFT p50 {d['median_ttft_ms']:.1f} "
        f"p99 {d['p99_ttft_ms']:.1f} ms, failed {d.get('failed', 0)}"
    )


if __name__ == "__main__":
    res, tokenizer, names, urls, served_names, *runs = sys.argv[1:]
    out = Path(res)
    out.mkdir(parents=True, exist_ok=True)
    servers = list(zip(names.split(","), urls.split(","), served_names.split(","), strict=True))
    for spec in runs:
        c, run = spec.split(":")
        for name, url, served in servers:
            late = time.time() > float(os.environ.get("VBENCH_DEADLINE") or "inf")
            line = (
                f"{name:9} c={c:>3} run {run}: skipped (deadline)"
                if late
                else one(out, tokenizer, name, url, served, int(c), run)
            )
            print(line, flush=True)
            with open(out / "summary.txt", "a") as f:
                f.write(line + "\n")
