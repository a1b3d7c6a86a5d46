#!/usr/bin/env bash
# Compare launch plans on a GPU host (after scripts/gpu-host.sh's staging): for each
# "label[:key=value,key=value]" argument, serve the full-size demo model with those pins,
# warm it, bench it, stop it. Results: $OUT/<label>/bench.{json,png}; log on stdout.
#   OUT=/tmp/r LEVELS=1,16,128 VERIFY=1 bash scripts/gpu-compare.sh default tp2:tensor_parallel_size=2
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-results/gpu-$(date +%Y%m%d-%H%M%S)}
LEVELS=${LEVELS:-1,16,128}
G="bash scripts/gpu-host.sh"
mkdir -p "$OUT"
$G demo-model /tmp/erniechat-demo-full --full-size | tail -1
for spec in "$@"; do
  label=${spec%%:*}
  pins=""; [ "$spec" != "$label" ] && pins=${spec#*:}
  sets=(); IFS=, read -ra kv <<< "$pins"
  for p in "${kv[@]}"; do [ -n "$p" ] && sets+=(--set "$p"); done
  log=/tmp/serve-$label.log
  $G serve --model demo "${sets[@]}" > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 900); do grep -q "^ready:\|^error:" "$log" && break; sleep 1; done
  echo "== $label: $(grep -h '^plan:' "$log")"
  grep -h "^ready:\|^error:\|^warm-up:" "$log"
  if grep -q "^ready:" "$log"; then
    $G status --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print("startup", s["startup"]); print("warmup", json.dumps(s["warmup"]))'
    $G bench --concurrency "$LEVELS" --max-tokens 128 --out "$OUT/$label" --label "$label" ${BENCH_ARGS:-}
    [ -n "${VERIFY:-}" ] && $G verify
  fi
  kill -INT "$pid"; wait "$pid"
done
