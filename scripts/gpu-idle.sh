#!/usr/bin/env bash
# On a GPU host (.gpu/ carried; see scripts/gpu-host.sh): is the engine still warm after 10 minutes
# idle (issue 15)? One device call is at most 10 minutes with the engine's start inside it, so this
# spans two calls on the same warm machine (a process in its own session outlives its call):
#   call A: OUT=$OUT bash scripts/gpu-idle.sh start [serve flags]
#           `serve` (its defaults: 8 users) started with setsid; after `ready:`, scripts/warmth_probe.py's
#           passes (each path's first request and three more, again, page-path requests after 1/3/10 s)
#   call B, within the machine's warm time: OUT=$OUT IDLE_S=540 bash scripts/gpu-idle.sh probe
#           sleeps until IDLE_S after call A's last request, sends the same passes (the first request
#           is the one that meets the idle engine; the passes take about 60 s, so IDLE_S above ~540
#           runs call B past its 10 minutes), then stops everything
# nvidia-smi logs the GPU's clocks every second from call A's `ready:` to the end (read only).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:?start or probe}; shift
RES=/tmp/gpu-results-$mode
source scripts/gpu-lib.sh
STAMP=/tmp/erniechat-idle-since

probe() {  # DIR: the warmth probe's passes against the running serve
  local url; url=$(grep -m1 "^ready:" /tmp/erniechat-idle-serve.log | awk '{print $2}')
  warmth_probe run "$url" demo "$1" --order sampled 2>&1 | tail -5
  date +%s > "$STAMP"
}

case $mode in
  start)
    gpu_clean  # not gpu_begin: its exit trap would stop the serve that call B probes
    demo_checkpoint
    setsid bash scripts/gpu-host.sh serve --model demo "$@" > /tmp/erniechat-idle-serve.log 2>&1 < /dev/null &
    if ! wait_for_line /tmp/erniechat-idle-serve.log "^ready:" 100 480; then
      cp /tmp/erniechat-idle-serve.log "$RES/serve.log"; gpu_clean; save_results; exit 1
    fi
    setsid nvidia-smi "${CLOCK_QUERY[@]}" -l 1 > /tmp/erniechat-idle-clocks.csv 2>&1 < /dev/null &
    probe "$RES/after-ready"
    grep -h "^plan:\|^ready:\|^warm-up:" /tmp/erniechat-idle-serve.log | cut -c1-300
    cp /tmp/erniechat-idle-clocks.csv "$RES/after-ready/gpu-clocks.csv"
    warmth_probe summary "$RES/after-ready"
    save_results
    echo "idle since $(date -u -d @"$(cat "$STAMP")" +%T); call B: IDLE_S=540 bash scripts/gpu-idle.sh probe"
    ;;
  probe)
    [ -f "$STAMP" ] || { echo "no call A on this machine (it was given back?)"; exit 3; }
    wait_s=$(( ${IDLE_S:-540} - ($(date +%s) - $(cat "$STAMP")) ))
    echo "idle $(( $(date +%s) - $(cat "$STAMP") )) s so far; sleeping $wait_s s more"
    (( wait_s > 0 )) && sleep "$wait_s"
    echo "idle for $(( $(date +%s) - $(cat "$STAMP") )) s"
    probe "$RES/after-idle"
    pkill -f "nvidia-smi --query-gpu=timestamp" 2>/dev/null
    cp /tmp/erniechat-idle-clocks.csv "$RES/after-idle/gpu-clocks.csv"
    cp /tmp/erniechat-idle-serve.log "$RES/serve.log"
    warmth_probe summary "$RES/after-idle"
    gpu_clean; save_results
    ;;
  *) echo "usage: gpu-idle.sh start|probe"; exit 2 ;;
esac
