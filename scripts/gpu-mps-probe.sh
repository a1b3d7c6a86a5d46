#!/usr/bin/env bash
# On the GPU host (the host's own torch; nothing carried): scripts/mps_probe.py's two processes,
# first plain (the GPU time-slices between them), then under an MPS daemon of this user's own,
# when the host has nvidia-cuda-mps-control and it starts. The daemon is quit on exit; the GPU's
# settings are not touched. Results: $OUT/mps/{plain,mps}.jsonl and host.txt.
set -uo pipefail
OUT=${OUT:-/tmp/out}
RES=$OUT/mps
mkdir -p "$RES"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/erniechat-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/erniechat-mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"

pair() {  # both workers, phases from 10 s from now (torch and the graph ready by then)
  local start
  start=$(python3 -c 'import time; print(time.time() + 10)')
  python3 scripts/mps_probe.py worker "$start" 0 > "$RES/$1.0" 2>&1 &
  python3 scripts/mps_probe.py worker "$start" 1 > "$RES/$1.1" 2>&1
  wait
  cat "$RES/$1.0" "$RES/$1.1" > "$RES/$1.jsonl"
}

{
  nvidia-smi --query-gpu=name,compute_mode,driver_version --format=csv
  command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control on PATH"
} > "$RES/host.txt" 2>&1
pair plain
if command -v nvidia-cuda-mps-control > /dev/null; then
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  if nvidia-cuda-mps-control -d >> "$RES/host.txt" 2>&1; then
    echo "mps daemon started" >> "$RES/host.txt"
    pair mps
    cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$RES"/ 2>/dev/null
  else
    echo "mps daemon did not start" >> "$RES/host.txt"
  fi
fi
cat "$RES/host.txt" "$RES"/*.jsonl
