#!/usr/bin/env bash
# On a GPU host (.gpu/ carried, and .whl/ with the router, chainlit's wheels and py-spy; see
# scripts/gpu-host.sh): `up` (the plan's engines, the router, the chat page), then
#   1. the page's first new chats right after `chat:` against later ones, and every request
#      path's first request after `ready:` against its steady state (through the router);
#   2. `bench --page`: the page against the engine direct at 1, 16 and 64 chats;
#   3. the router's added TTFT: vLLM's `vllm bench serve` at 1 and 16 against engine 0 direct;
#   4. `bench-page`: the page's added TTFT against a Chainlit echo app's floor;
#   5. with DEFAULTS_RUNS=N: N runs at 256 concurrent against the plan, then (after stopping `up`)
#      against vLLM's defaults.
#   OUT=/tmp/r bash scripts/gpu-page.sh [up flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
trap 'gpu_clean; save_results' EXIT
gpu_clean
[ -d "$DIR" ] || $G demo-model "$DIR" --full-size | tail -1

if start_backend "$RES/up.log" "^chat:" up --model demo --users 64 "$@"; then
  $G status --json > "$RES/status.json"
  python3 - <<'PY' | tee "$RES/first-use.json"
import asyncio, json
from backend.measure.startup_bench import page_first_chats, path_warmth
page = asyncio.run(page_first_chats("http://127.0.0.1:8080"))
paths = asyncio.run(path_warmth("http://127.0.0.1:8000/v1", "demo", None))
print(json.dumps({"page_first_chats_ttft_s": page, "paths_after_ready": paths}))
PY
  save_results
  $G bench --page http://127.0.0.1:8080 --concurrency 1,16,64 --max-tokens 128 --out "$RES/page-vs-direct" \
    --label "page vs direct, 1 x H200" 2>&1 | tail -12
  save_results
  for c in 1 16; do for r in 1 2; do
    vbench router http://127.0.0.1:8000 "$c" "$r"; vbench engine0 http://127.0.0.1:8001 "$c" "$r"
  done; done
  save_results
  for r in $(seq "${DEFAULTS_RUNS:-0}"); do vbench project http://127.0.0.1:8000 256 "b$r"; done
  save_results
  $G bench-page --page http://127.0.0.1:8080 --concurrency 1,16 --rounds 6 --max-tokens 64 \
    --out "$RES/page-floor" 2>&1 | tail -12
  save_results
fi
gpu_clean; save_results
if [ -n "${DEFAULTS_RUNS:-}" ]; then
  python3 -m vllm.entrypoints.cli.main serve "$DIR" --port 8100 > "$RES/defaults-server.log" 2>&1 &
  if wait_health http://127.0.0.1:8100; then
    vbench defaults http://127.0.0.1:8100 16 warm "$DIR"
    for r in $(seq "$DEFAULTS_RUNS"); do vbench defaults http://127.0.0.1:8100 256 "b$r" "$DIR"; done
  else echo "defaults: not healthy"; tail -20 "$RES/defaults-server.log"; fi
fi
