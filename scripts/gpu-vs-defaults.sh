#!/usr/bin/env bash
# On a GPU host (after scripts/gpu-host.sh's staging): vLLM's own `vllm bench serve` against
# `vllm serve DIR` with vLLM's defaults and against the project's plan (`serve`), in the same
# call, REPEATS runs per level; then the router's added TTFT (one engine direct against the
# router) at 1 and 16 concurrent. Results: $OUT/<server>-c<C>-r<N>.json; log on stdout.
#   OUT=/tmp/r REPEATS=3 LEVELS="128 256" bash scripts/gpu-vs-defaults.sh [serve flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-results/vs-defaults-$(date +%Y%m%d-%H%M%S)}
REPEATS=${REPEATS:-3}
LEVELS=${LEVELS:-128 256}
DIR=${ERNIECHAT_MODEL__DEMO_DIR:-/tmp/erniechat-demo-full}
G="bash scripts/gpu-host.sh"
mkdir -p "$OUT"
source .gpu/stage.sh
$G demo-model "$DIR" --full-size | tail -1

wait_for() {  # URL: wait until /health answers (at most 600 s)
  for _ in $(seq 240); do
    python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)" "$1" \
      2>/dev/null && return 0
    sleep 1
  done
  return 1
}
bench() {  # NAME URL C RUN
  python3 -m vllm.entrypoints.cli.main bench serve --base-url "$2" --model "$SERVED" --tokenizer "$DIR" \
    --dataset-name random --random-input-len 512 --random-output-len 128 --ignore-eos \
    --num-prompts $(( $3 * 4 )) --max-concurrency "$3" --save-result --result-dir "$OUT" \
    --result-filename "$1-c$3-r$4.json" > "$OUT/$1-c$3-r$4.log" 2>&1
  python3 - "$OUT/$1-c$3-r$4.json" "$1" "$3" "$4" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:9} c={sys.argv[3]:>3} run {sys.argv[4]}: {d['output_throughput']:8.0f} tok/s, "
      f"TTFT p50 {d['median_ttft_ms']:.1f} p99 {d['p99_ttft_ms']:.1f} ms, failed {d.get('failed', 0)}")
PY
}

# 1. the project's plan (first: it is the one whose start-up is longer) (engines + router), as `serve` starts it
SERVED=demo
$G serve --model demo --users 256 "$@" > "$OUT/project-serve.log" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "^ready:\|^error:" "$OUT/project-serve.log" && break; sleep 1; done
grep -h "^plan:\|^ready:\|^error:\|^warm-up:\|^router:\|^engine " "$OUT/project-serve.log"
if grep -q "^ready:" "$OUT/project-serve.log"; then
  $G status --json > "$OUT/project-status.json"
  bench project http://127.0.0.1:8000 16 warm
  for c in $LEVELS; do for r in $(seq "$REPEATS"); do bench project http://127.0.0.1:8000 "$c" "$r"; done; done
  # 3. the router's added TTFT: engine 0 straight against through the router
  for c in 1 16; do for r in $(seq "$REPEATS"); do
    bench router http://127.0.0.1:8000 "$c" "$r"; bench engine0 http://127.0.0.1:8001 "$c" "$r"
  done; done
fi
kill -INT "$pid"; wait "$pid" 2>/dev/null
# 2. vLLM's defaults
SERVED=$DIR
python3 -m vllm.entrypoints.openai.api_server --model "$DIR" --port 8100 > "$OUT/defaults-server.log" 2>&1 &
pid=$!
if wait_for http://127.0.0.1:8100; then
  bench defaults http://127.0.0.1:8100 16 warm   # first use (both servers get one unmeasured level)
  for c in $LEVELS; do for r in $(seq "$REPEATS"); do bench defaults http://127.0.0.1:8100 "$c" "$r"; done; done
else echo "defaults: not healthy"; tail -20 "$OUT/defaults-server.log"; fi
kill -INT "$pid"; wait "$pid" 2>/dev/null

echo "results in $OUT"
