#!/usr/bin/env bash
# On a GPU host (.gpu/ carried, and .whl/ with the router; see scripts/gpu-host.sh): vLLM's own
# `vllm bench serve` against the project's plan (`serve`: its engines behind the router) and
# against `vllm serve DIR` with vLLM's defaults, in the same call, REPEATS runs per level (levels
# interleaved: 128, 256, 128, 256, ...). Every server gets one unmeasured level of 16 first.
# VARIANT="name:flag flag ..." adds a second project plan (e.g. "mps:--set gpu_sharing=mps"),
# measured after the defaults; DEFAULTS=0 leaves `vllm serve` out (the plan against the variant).
# If start-up stalls, every vLLM process's Python stack goes to diagnose.txt (py-spy).
#   OUT=/tmp/r REPEATS=3 LEVELS="128 256" bash scripts/gpu-vs-defaults.sh [serve flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
REPEATS=${REPEATS:-3}
read -ra LV <<< "${LEVELS:-128 256}"

project() {  # NAME serve-flags...: the project's plan as `serve` starts it, measured, stopped
  local name=$1; shift
  if start_backend "$RES/$name-serve.log" "^ready:" serve --model demo --users 256 "$@"; then
    $G status --json > "$RES/$name-status.json"
    nvidia-smi > "$RES/$name-nvidia-smi.txt" 2>&1  # under MPS: its server holds the GPU, the engines are its clients
    vbench "$name" http://127.0.0.1:8000 demo $(levels "$REPEATS" "${LV[@]}")
  fi
  cp -r /tmp/erniechat-run/mps-log "$RES/$name-mps-log" 2>/dev/null
  gpu_clean; save_results
}

gpu_begin
echo "host: $(nproc) cores; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"
project project "$@"
if [ "${DEFAULTS:-1}" != 0 ]; then
  python3 -m vllm.entrypoints.cli.main serve "$DIR" --port 8100 > "$RES/defaults-server.log" 2>&1 &
  if wait_health http://127.0.0.1:8100; then
    vbench defaults http://127.0.0.1:8100 "$DIR" $(levels "$REPEATS" "${LV[@]}")
  else echo "defaults: not healthy"; tail -20 "$RES/defaults-server.log"; fi
  gpu_clean; save_results
fi
if [ -n "${VARIANT:-}" ]; then
  read -ra flags <<< "${VARIANT#*:}"
  project "${VARIANT%%:*}" "${flags[@]}"
fi
