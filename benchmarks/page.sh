#!/usr/bin/env bash
# The chat page at GPU speed: `up --model demo --users 64` (the plan's engines, the router when there
# are several, the chat page), then
#   1. the page's first new chats right after `chat:` against later ones, and every request path's
#      first request after `ready:` against its steady state (first-use.json);
#   2. `bench --page`: the page against the engine direct at 1, 16 and 64 chats, with the page
#      process's CPU seconds over the run (page-cpu.txt);
#   3. `bench-page`: the page's added TTFT against a do-nothing Chainlit echo app's floor.
# PAGES_AB=N instead: the plan's page (several page processes at 64 users) against one page process
# (`backend.page.launch` on :8081, same engine), `bench --page` at 64 chats against each in turn,
# N times, then the plan's page at 1 and 16 chats.
# LAUNCH_AB=N instead: Chainlit's own `chainlit run` (which applies nest_asyncio) against the
# project's start (`backend.page.launch`) on the same engine, 64 chats against each in turn, N times.
# Flags after the script go to `up`.
#   OUT=bench-results/page PAGES_AB=3 bash benchmarks/page.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lib.sh
begin

cpu_s() {  # PID: user + system seconds (100 Hz ticks) of the process group PID leads (or of PID)
  local total=0 p pids
  pids=$(pgrep -g "$1"); [ -n "$pids" ] || pids=$1
  for p in $pids; do total=$(awk -v t="$total" '{print t + ($14 + $15) / 100}' "/proc/$p/stat"); done
  echo "$total"
}

page_bench() {  # PORT PID TAG N: `bench --page` at 64 chats, N requests, against the page at PORT
  local c0 t0; c0=$(cpu_s "$2"); t0=$(date +%s.%N)
  $B bench --page "http://127.0.0.1:$1" --concurrency 64 --requests-per-level "$4" --max-tokens 128 \
    --out "$OUT/$3" --label "$3" 2>&1 | grep "^direct\|^page"
  .venv/bin/python -c "import sys; c, w = float(sys.argv[3]) - float(sys.argv[2]), float(sys.argv[5]) - float(sys.argv[4]); \
print(f'{sys.argv[1]}: {c:.1f} CPU s over {w:.1f} s ({c / w:.0%} of one core)')" \
    "$3" "$c0" "$(cpu_s "$2")" "$t0" "$(date +%s.%N)" | tee -a "$OUT/page-cpu.txt"
}

second_page() {  # LOG CMD...: a second page on :8081 on the same engine, until it answers; its pid
  setsid "${@:2}" > "$1" 2>&1 &
  STARTED+=($!)
  for _ in $(seq 60); do
    .venv/bin/python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/', timeout=2)" \
      2>/dev/null && break
    sleep 1
  done
}

start_backend "$OUT/up.log" "^chat:" up --model demo --users 64 "$@" || exit 1
$B status --json > "$OUT/status.json"
if [ -n "${PAGES_AB:-}" ]; then
  plan_pid=$(pgrep -f "backend[.]page[.]launch.*--workers" | head -1)
  second_page "$OUT/one-process-page.log" .venv/bin/python -m backend.page.launch app.py --port 8081
  for r in $(seq "$PAGES_AB"); do
    page_bench 8080 "$plan_pid" "plan-pages-$r" 384
    page_bench 8081 "${STARTED[-1]}" "one-page-$r" 384
  done
  $B bench --page http://127.0.0.1:8080 --concurrency 1,16 --max-tokens 128 --out "$OUT/plan-pages-1-16" \
    --label "the plan's page" 2>&1 | grep "^direct\|^page"
elif [ -n "${LAUNCH_AB:-}" ]; then
  launch_pid=$(pgrep -f "backend[.]page[.]launch" | head -1)
  second_page "$OUT/chainlit-run.log" .venv/bin/python -m chainlit run app.py --headless --host 127.0.0.1 --port 8081
  for r in $(seq "$LAUNCH_AB"); do
    page_bench 8080 "$launch_pid" "launch-$r" 384
    page_bench 8081 "${STARTED[-1]}" "chainlit-run-$r" 384
  done
else
  .venv/bin/python - <<'PY' | tee "$OUT/first-use.json"
import asyncio, json
from backend.measure.startup.bench import page_first_chats, path_warmth
page = asyncio.run(page_first_chats("http://127.0.0.1:8080"))
paths = asyncio.run(path_warmth("http://127.0.0.1:8000/v1", "demo", None))
print(json.dumps({"page_first_chats_ttft_s": [c.ttft_s for c in page], "page_first_chats_footers_ms": [c.footer_ms for c in page],
                  "paths_after_ready": paths}))
PY
  page_pid=$(pgrep -f "backend[.]page[.]launch" | head -1)
  c0=$(cpu_s "$page_pid"); t0=$(date +%s.%N)
  $B bench --page http://127.0.0.1:8080 --concurrency 1,16,64 --max-tokens 128 --out "$OUT/page-vs-direct" \
    --label "page vs direct" 2>&1 | tail -12
  .venv/bin/python -c "import sys; c, w = float(sys.argv[2]) - float(sys.argv[1]), float(sys.argv[4]) - float(sys.argv[3]); \
print(f'page: {c:.1f} CPU s over {w:.1f} s of bench --page ({c / w:.0%} of one core)')" \
    "$c0" "$(cpu_s "$page_pid")" "$t0" "$(date +%s.%N)" | tee "$OUT/page-cpu.txt"
  $B bench-page --page http://127.0.0.1:8080 --concurrency 1,16 --rounds 6 --max-tokens 64 \
    --out "$OUT/page-floor" 2>&1 | tail -12
fi
