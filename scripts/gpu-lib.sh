# Sourced by the GPU-host scripts (gpu-vs-defaults.sh, gpu-page.sh, gpu-warmth.sh): stage vLLM and the carried
# packages, and the helpers they share. Results go to $RES; save_results packs it into
# $OUT/results.tar.gz (the device returns at most 8 files), after every stage, so a call cut
# at its time limit still returns what it measured.
[ -f .gpu/stage.sh ] || { echo "no .gpu/ here: carry it (or run in the call right after one that did)"; exit 3; }
source .gpu/stage.sh || exit 3
source scripts/gpu-stage-extra.sh
OUT=${OUT:-bench-results/gpu-$(date +%Y%m%d-%H%M%S)}
RES=${RES:-/tmp/gpu-results}
DIR=${ERNIECHAT_MODEL__DEMO_DIR:-/tmp/erniechat-demo-full}
G="bash scripts/gpu-host.sh"
rm -rf "$RES"  # a warm machine keeps /tmp between calls: each call returns only what it measured
mkdir -p "$OUT" "$RES"

save_results() { tar -czf "$OUT/results.tar.gz" -C "$RES" . 2>/dev/null; }

# nvidia-smi's flags for a CSV of the GPU's clocks, power and use (read only); add -lms N or -l N
CLOCK_QUERY=(--query-gpu=timestamp,clocks.sm,clocks.mem,pstate,power.draw,utilization.gpu --format=csv,noheader,nounits)

warmth_probe() {  # run URL MODEL DIR --order O | summary DIR...: scripts/warmth_probe.py, the repo importable
  PYTHONPATH=".:${PYTHONPATH:-}" python3 scripts/warmth_probe.py "$@"
}

gpu_clean() {  # serve's engines run in their own session: a call's end does not reach them
  pkill -u "$(id -u)" -INT -f "python3 -m backend (serve|up)" 2>/dev/null && sleep 6
  nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9 2>/dev/null
  pkill -u "$(id -u)" -9 -f vllm_router.launch_router 2>/dev/null
  pkill -u "$(id -u)" -9 -f "vllm.entrypoints.cli.main serve" 2>/dev/null
  # renamed children (vLLM's, the router's) outlive a call cut at its limit (MPS clients are not in
  # nvidia-smi's list): left on engine ports, they shared them with the next call's engines
  pkill -u "$(id -u)" -9 -f "^VLLM::|EngineCore|^vllm::router" 2>/dev/null
  sleep 2
}

demo_checkpoint() {  # the full-size demo checkpoint, made once per machine
  [ -d "$DIR" ] || $G demo-model "$DIR" --full-size | tail -1
}

gpu_begin() {  # every script's start: stop what a previous call left, save results on any exit,
  # make the full-size demo checkpoint if this machine has none yet
  trap 'gpu_clean; save_results' EXIT
  gpu_clean
  demo_checkpoint
}

diagnose() {  # where every vLLM process is (py-spy from .whl/)
  { date; nvidia-smi; df -h /dev/shm /tmp; uptime
    for pid in $(pgrep -f "vllm|VLLM|vllm_router"); do
      echo "=== pid $pid: $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-240)"
      timeout 20 py-spy dump --pid "$pid" 2>&1 | head -80
    done; } > "$RES/diagnose.txt" 2>&1
}

wait_for_line() {  # LOG PATTERN STALL_S LIMIT_S: until LOG has a line matching PATTERN (0), or
  # `error:`, or no new output for STALL_S, or LIMIT_S in all (1, with diagnose.txt)
  local log=$1 pattern=$2 stall=$3 limit=$4 t0 now moved last="" line
  t0=$(date +%s); moved=$t0
  while :; do
    grep -q "$pattern" "$log" && return 0
    grep -q "^error:" "$log" && return 1
    now=$(date +%s); line=$(tail -c 300 "$log")
    [ "$line" != "$last" ] && { last=$line; moved=$now; }
    if (( now - moved > stall || now - t0 > limit )); then
      echo "stalled at: $(tail -1 "$log" | tr '\r' '\n' | tail -1)"; diagnose; return 1
    fi
    sleep 2
  done
}

start_backend() {  # LOG READY_PATTERN ARGS...: `python -m backend ARGS` in the background until it
  # prints READY_PATTERN; keeps the run dir's logs and shows the key lines; 0 once ready
  local log=$1 ready=$2; shift 2
  $G "$@" > "$log" 2>&1 &
  wait_for_line "$log" "$ready" 100 480
  cp /tmp/erniechat-run/*.log "$RES/" 2>/dev/null
  grep -h "^plan:\|^ready:\|^chat:\|^error:\|^warm-up:\|^router:\|^engine " "$log" | cut -c1-400
  grep -q "$ready" "$log"
}

wait_health() {  # URL: until /health answers (at most 600 s)
  for _ in $(seq 300); do
    python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)" "$1" \
      2>/dev/null && return 0
    sleep 2
  done
  return 1
}

vbench() {  # NAME URL SERVED C:RUN...: vLLM's own `vllm bench serve` (scripts/vbench_many.py: all
  # runs in one process), random 512 in / 128 out, max(32, 4C) requests, a line each in summary.txt
  local name=$1 url=$2 served=$3; shift 3
  python3 scripts/vbench_many.py "$RES" "$DIR" "$name" "$url" "$served" "$@"
}

levels() {  # RUNS LEVEL...: "C:RUN" for every level and run 1..RUNS, levels in turn, after a warm level of 16
  local runs=$1 c r; shift
  echo -n "16:warm"
  for r in $(seq "$runs"); do for c in "$@"; do echo -n " $c:$r"; done; done
}
