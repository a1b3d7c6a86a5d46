#!/usr/bin/env bash
# On a GPU host (.gpu/ carried; see scripts/gpu-host.sh): why the engine's first requests after
# `ready:` can cost more than its steady state (issue 15). `serve --users 64` is started once per
# word of ORDERS (default "sampled greedy sampled"); after each `ready:`, scripts/warmth_probe.py
# sends every path's first request in that order, the same pass again, and page-path requests after
# 1, 3 and 10 s idle, while nvidia-smi logs the GPU's clocks and power every 50 ms (read only).
#   OUT=/tmp/r [ORDERS="sampled greedy"] bash scripts/gpu-warmth.sh [serve flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
gpu_begin
{ cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>&1; nproc; grep -m1 "model name" /proc/cpuinfo
  nvidia-smi -q -d CLOCK,PERFORMANCE,POWER; } > "$RES/host.txt" 2>&1
n=0
for order in ${ORDERS:-sampled greedy sampled}; do
  n=$((n + 1))
  dir="$RES/start-$n-$order"; mkdir -p "$dir"
  start_backend "$dir/serve.log" "^ready:" serve --model demo --users 64 "$@" || break
  url=$(grep -m1 "^ready:" "$dir/serve.log" | awk '{print $2}')
  nvidia-smi "${CLOCK_QUERY[@]}" -lms 50 > "$dir/gpu-clocks.csv" 2>&1 &
  smi=$!
  warmth_probe run "$url" demo "$dir" --order "$order" 2>&1 | tail -5
  kill "$smi"
  cp /tmp/erniechat-run/status.json "$dir/" 2>/dev/null
  gpu_clean
  save_results
done
