#!/usr/bin/env bash
# On a GPU host (.gpu/ carried, and .whl/ with the router, chainlit's wheels and py-spy; see
# scripts/gpu-host.sh): `up` (the plan's engines, the router when there are several, the chat
# page), then
#   1. the page's first new chats right after `chat:` against later ones, and every request
#      path's first request after `ready:` against its steady state;
#   2. `bench --page`: the page against the engine direct at 1, 16 and 64 chats, with the
#      Chainlit process's CPU seconds over the run and its profile (py-spy, collapsed stacks);
#   3. `bench-page`: the page's added TTFT against a Chainlit echo app's floor;
#   4. with ROUTER_TTFT=1: the router's added TTFT (`vllm bench serve` at 1 and 16, engine 0 direct).
#   With LAUNCH_AB=N instead of 1-4: Chainlit's own `chainlit run` (nest_asyncio) beside the
#   project's start (`backend.page.launch`) on the same engine, `bench --page` at 64 chats against
#   each in turn, N times, with each page process's CPU seconds (page-cpu.txt).
#   With PAGES_AB=N instead: the plan's page (`up --users 64`: several page processes) against one
#   page process (`backend.page.launch` on :8081, same engine), `bench --page` at 64 chats against
#   each in turn, N times (CPU seconds summed over each page's process group), then the plan's
#   page at 1 and 16 chats.
#   OUT=/tmp/r bash scripts/gpu-page.sh [up flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
gpu_begin

cpu_s() {  # PID: user + system seconds (100 Hz ticks) of the process group PID leads (or of PID)
  local total=0 p pids
  pids=$(pgrep -g "$1"); [ -n "$pids" ] || pids=$1
  for p in $pids; do total=$(awk -v t="$total" '{print t + ($14 + $15) / 100}' "/proc/$p/stat"); done
  echo "$total"
}

page_bench() {  # PORT PID TAG N: `bench --page` at 64 chats, N requests, against the page at PORT
  local c0 t0; c0=$(cpu_s "$2"); t0=$(date +%s.%N)
  $G bench --page "http://127.0.0.1:$1" --concurrency 64 --requests-per-level "$4" --max-tokens 128 \
    --out "$RES/$3" --label "$3, 1 x H200" 2>&1 | grep "^direct\|^page"
  python3 -c "import sys; c, w = float(sys.argv[3]) - float(sys.argv[2]), float(sys.argv[5]) - float(sys.argv[4]); \
print(f'{sys.argv[1]}: {c:.1f} CPU s over {w:.1f} s ({c / w:.0%} of one core)')" \
    "$3" "$c0" "$(cpu_s "$2")" "$t0" "$(date +%s.%N)" | tee -a "$RES/page-cpu.txt"
}

if [ -n "${PAGES_AB:-}" ] && start_backend "$RES/up.log" "^chat:" up --model demo --users 64 "$@"; then
  $G status --json > "$RES/status.json"
  plan_pid=$(pgrep -f "backend[.]page[.]launch.*--workers" | head -1)
  setsid env ERNIECHAT_ENGINE__RUN_DIR=/tmp/erniechat-run python3 -m backend.page.launch app.py --port 8081 \
    > "$RES/one-process-page.log" 2>&1 &
  one_pid=$!
  for _ in $(seq 60); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/', timeout=2)" 2>/dev/null && break
    sleep 1
  done
  grep "chat page:" "$RES/chat-page.log" /tmp/erniechat-run/chat-page.log 2>/dev/null | head -2
  for r in $(seq "$PAGES_AB"); do
    page_bench 8080 "$plan_pid" "plan-pages-$r" 384
    page_bench 8081 "$one_pid" "one-page-$r" 384
    save_results
  done
  kill "$one_pid"
  $G bench --page http://127.0.0.1:8080 --concurrency 1,16 --max-tokens 128 --out "$RES/plan-pages-1-16" \
    --label "the plan's page, 1 x H200" 2>&1 | grep "^direct\|^page"
  save_results
elif [ -n "${LAUNCH_AB:-}" ] && start_backend "$RES/up.log" "^chat:" up --model demo --users 64 "$@"; then
  launch_pid=$(pgrep -f "backend[.]page[.]launch" | head -1)
  ERNIECHAT_ENGINE__RUN_DIR=/tmp/erniechat-run python3 -m chainlit run app.py --headless --host 127.0.0.1 \
    --port 8081 > "$RES/chainlit-run.log" 2>&1 &
  run_pid=$!
  for _ in $(seq 60); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/', timeout=2)" 2>/dev/null && break
    sleep 1
  done
  for r in $(seq "$LAUNCH_AB"); do
    page_bench 8080 "$launch_pid" "launch-$r" 384
    page_bench 8081 "$run_pid" "chainlit-run-$r" 384
    save_results
  done
  kill "$run_pid"
elif start_backend "$RES/up.log" "^chat:" up --model demo --users 64 "$@"; then
  $G status --json > "$RES/status.json"
  python3 - <<'PY' | tee "$RES/first-use.json"
import asyncio, json
from backend.measure.startup_bench import page_first_chats, path_warmth
page = asyncio.run(page_first_chats("http://127.0.0.1:8080"))
paths = asyncio.run(path_warmth("http://127.0.0.1:8000/v1", "demo", None))
print(json.dumps({"page_first_chats_ttft_s": [c.ttft_s for c in page], "page_first_chats_footers_ms": [c.footer_ms for c in page],
                  "paths_after_ready": paths}))
PY
  save_results
  page_pid=$(pgrep -f "backend[.]page[.]launch" | head -1)
  c0=$(cpu_s "$page_pid"); t0=$(date +%s.%N)
  py-spy record --pid "$page_pid" --format raw --rate 100 --nonblocking -o "$RES/chainlit-spy.txt" \
    > "$RES/py-spy.log" 2>&1 &
  spy=$!
  $G bench --page http://127.0.0.1:8080 --concurrency 1,16,64 --max-tokens 128 --out "$RES/page-vs-direct" \
    --label "page vs direct, 1 x H200" 2>&1 | tail -12
  kill -INT "$spy"; wait "$spy"
  python3 -c "import sys; c, w = float(sys.argv[2]) - float(sys.argv[1]), float(sys.argv[4]) - float(sys.argv[3]); \
print(f'chainlit process: {c:.1f} CPU s over {w:.1f} s of bench --page ({c / w:.0%} of one core)')" \
    "$c0" "$(cpu_s "$page_pid")" "$t0" "$(date +%s.%N)" | tee "$RES/chainlit-cpu.txt"
  save_results
  if [ -n "${ROUTER_TTFT:-}" ]; then
    vbench router http://127.0.0.1:8000 demo 1:1 16:1 1:2 16:2
    vbench engine0 http://127.0.0.1:8001 demo 1:1 16:1 1:2 16:2
    save_results
  fi
  $G bench-page --page http://127.0.0.1:8080 --concurrency 1,16 --rounds 6 --max-tokens 64 \
    --out "$RES/page-floor" 2>&1 | tail -12
  save_results
fi
