#!/usr/bin/env bash
# On a GPU host (.gpu/ carried, and .whl/ with the router; see scripts/gpu-host.sh): vLLM's own
# `vllm bench serve` against the project's plan (`serve`: its engines behind the router) and
# against `vllm serve DIR` with vLLM's defaults, in the same call, REPEATS runs per level.
# Every server gets one unmeasured level of 16 first. ROUTER_TTFT=1 adds the router's added
# TTFT (engine 0 direct against the router, 1 and 16 concurrent). If start-up stalls, every
# vLLM process's Python stack goes to diagnose.txt (py-spy).
#   OUT=/tmp/r REPEATS=3 LEVELS="128 256" bash scripts/gpu-vs-defaults.sh [serve flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
REPEATS=${REPEATS:-3}
LEVELS=${LEVELS:-128 256}
trap 'gpu_clean; save_results' EXIT

gpu_clean
$G demo-model "$DIR" --full-size | tail -1
echo "host: $(nproc) cores; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"

# 1. the project's plan, as `serve` starts it (first: its start-up is the longer)
if start_backend "$RES/project-serve.log" "^ready:" serve --model demo --users 256 "$@"; then
  $G status --json > "$RES/project-status.json"
  vbench project http://127.0.0.1:8000 16 warm
  for c in $LEVELS; do for r in $(seq "$REPEATS"); do vbench project http://127.0.0.1:8000 "$c" "$r"; done; done
  if [ -n "${ROUTER_TTFT:-}" ]; then
    for c in 1 16; do for r in $(seq "$REPEATS"); do
      vbench router http://127.0.0.1:8000 "$c" "$r"; vbench engine0 http://127.0.0.1:8001 "$c" "$r"
    done; done
  fi
fi
gpu_clean; save_results

# 2. vLLM's defaults
python3 -m vllm.entrypoints.cli.main serve "$DIR" --port 8100 > "$RES/defaults-server.log" 2>&1 &
if wait_health http://127.0.0.1:8100; then
  vbench defaults http://127.0.0.1:8100 16 warm "$DIR"
  for c in $LEVELS; do for r in $(seq "$REPEATS"); do vbench defaults http://127.0.0.1:8100 "$c" "$r" "$DIR"; done; done
else echo "defaults: not healthy"; tail -20 "$RES/defaults-server.log"; fi
