#!/usr/bin/env bash
# The performance model on this CPU, calibrated on one plan and checked on another: the default plan (D) and
# `--users 256` (U), the tiny demo model. Each plan's warm-up calibrates the host's costs; each plan is then
# measured with `bench` at 1, 4 and 8 users (24 requests a level, greedy 128-token replies) and predicted with
# the other plan's costs, the defaults and its own, REPS times (3), interleaved. The first U start only
# calibrates. Then: .venv/bin/python benchmarks/prediction_summary.py $OUT
#   OUT=bench-results/cpu-prediction bash benchmarks/cpu-prediction.sh
set -uo pipefail
cd "$(dirname "$0")/.."
B=".venv/bin/python -m backend"
OUT=${OUT:-bench-results/cpu-prediction-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
PID=
trap '[ -n "$PID" ] && kill -INT $PID 2>/dev/null' EXIT

start() {  # NAME serve-flags...: a plan served from its own run directory until ready; its first calibration kept
  local name=$1; shift
  ERNIECHAT_ENGINE__RUN_DIR=$OUT/$name $B serve --model demo "$@" > "$OUT/$name.log" 2>&1 &
  PID=$!
  until grep -q "^ready:\|^error" "$OUT/$name.log"; do sleep 2; kill -0 $PID 2>/dev/null || return 1; done
  grep -E "^warm-up:|^expected" "$OUT/$name.log"
  [ -e "$OUT/costs-$name.json" ] || cp "$OUT/$name"/calibrated/*.json "$OUT/costs-$name.json"  # the first start's
}
stop() { kill -INT $PID; wait $PID; PID=; }
measure() {  # NAME OTHER: bench the running plan NAME with OTHER's costs, the defaults and its own
  for i in $(seq "${REPS:-3}"); do
    for costs in "$OUT/costs-$2.json" defaults own; do
      local tag=${costs##*/}; tag=${tag%.json}; local extra=()
      [ "$costs" = own ] || extra=(--costs "$costs")
      ERNIECHAT_ENGINE__RUN_DIR=$OUT/$1 $B bench --concurrency 1,4,8 --requests-per-level 24 \
        --out "$OUT/$1-bench-$i-$tag" "${extra[@]}" > "$OUT/$1-bench-$i-$tag.log" 2>&1
      grep "keep-alive" "$OUT/$1-bench-$i-$tag.log" | sed "s/^/$1 $i $tag: /"
    done
  done
}
start U --users 256 || exit 1; stop
start D || exit 1; measure D U; stop
start U --users 256 || exit 1; measure U D; stop
