#!/usr/bin/env bash
# Start-up: `serve` printing `ready:` (warm-up included) against `vllm serve DIR` answering /health,
# cold (vLLM's and torch's compile caches emptied first) and warm (kept), on the full-size demo
# checkpoint. A line each in $OUT/startup.txt, the same as JSON lines in $OUT/startup.jsonl.
#   bash benchmarks/startup.sh                       # --users 256 (three engines on one GPU), both kinds
#   USERS="1 256" ORDER="cold warm" bash benchmarks/startup.sh
#   VLLM=0 bash benchmarks/startup.sh                # serve only; USERS=none: vllm serve only
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lib.sh
read -ra USER_LEVELS <<< "${USERS:-256}"
read -ra ORDER <<< "${ORDER:-cold warm}"

clear_caches() {  # what makes a start cold: vLLM's compile cache (every engine's) and torch's
  rm -rf "${VLLM_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm}" "${TMPDIR:-/tmp}/torchinductor_$(whoami)"
}

record() {  # WHAT CACHE SECONDS: one line of each file
  printf '%-22s %-5s %6.1f s\n' "$1" "$2" "$3" | tee -a "$OUT/startup.txt"
  printf '{"what": "%s", "cache": "%s", "seconds": %.1f}\n' "$1" "$2" "$3" >> "$OUT/startup.jsonl"
}

since() { .venv/bin/python -c "import sys, time; print(time.time() - float(sys.argv[1]))" "$1"; }  # seconds since T0

vllm_health() {  # CACHE: `vllm serve` with its defaults until /health answers
  local t0 name="vllm-serve-$1"
  t0=$(date +%s.%N)
  .venv-engine/bin/vllm serve "$DIR" --port 8100 > "$OUT/$name.log" 2>&1 &
  STARTED+=($!)
  if wait_health http://127.0.0.1:8100; then record "vllm serve /health" "$1" "$(since "$t0")"; fi
  stop_all
}

project_ready() {  # CACHE USERS: `serve --users USERS` until it prints ready:
  local t0 name="serve-$2-$1"
  t0=$(date +%s.%N)
  if start_backend "$OUT/$name.log" "^ready:" serve --model demo --users "$2"; then
    record "serve --users $2 ready" "$1" "$(since "$t0")"
    $B status --json > "$OUT/$name-status.json"
  fi
  stop_all
}

begin
for cache in "${ORDER[@]}"; do
  [ "$cache" = cold ] && clear_caches
  [ "${VLLM:-1}" = 1 ] && vllm_health "$cache"
  for users in "${USER_LEVELS[@]}"; do
    [ "$users" = none ] && continue
    [ "$cache" = cold ] && clear_caches
    project_ready "$cache" "$users"
  done
done
cat "$OUT/startup.txt"
