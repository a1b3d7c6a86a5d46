# Sourced by vs-defaults.sh, page.sh, startup.sh and compare.sh: the helpers they share. Runs from the repository root of a
# checkout set up with `bash scripts/setup.sh` on a machine with an NVIDIA GPU (.venv: the project;
# .venv-engine: vLLM). Every server is measured on the full-size demo checkpoint (the real
# ERNIE-4.5-0.3B shape, random weights), so no download is needed. Results go to $OUT.
[ -x .venv/bin/python ] && [ -x .venv-engine/bin/vllm ] || {
  echo "benchmarks: run bash scripts/setup.sh first (on a machine with an NVIDIA GPU: .venv-engine holds vLLM)" >&2
  exit 3
}
OUT=${OUT:-bench-results/gpu-$(date +%Y%m%d-%H%M%S)}
RUN_DIR=${RUN_DIR:-$PWD/.run/bench}
DIR=${DEMO_DIR:-$PWD/.run/demo-full}
export ERNIECHAT_MODEL__DEMO_FULL_SIZE=true ERNIECHAT_MODEL__DEMO_DIR=$DIR ERNIECHAT_ENGINE__RUN_DIR=$RUN_DIR
B=".venv/bin/python -m backend"
ENGINE_PY=.venv-engine/bin/python
mkdir -p "$OUT"

# nvidia-smi's flags for a CSV of the GPU's clocks, power and use (read only); add -lms N or -l N
CLOCK_QUERY=(--query-gpu=timestamp,clocks.sm,clocks.mem,pstate,power.draw,utilization.gpu --format=csv,noheader,nounits)

stop_all() {  # what this script started: `serve`/`up` (they stop their engines, router and page), then `vllm serve`
  local pid
  for pid in "${STARTED[@]}"; do kill -INT "$pid" 2>/dev/null; done
  for pid in "${STARTED[@]}"; do wait "$pid" 2>/dev/null; done
  STARTED=()
}
STARTED=()

demo_checkpoint() {  # the full-size demo checkpoint, made once per machine
  [ -f "$DIR/config.json" ] || $B demo-model "$DIR" --full-size | tail -1
}

begin() {  # every script's start: stop what it started on any exit; make the demo checkpoint
  trap stop_all EXIT
  demo_checkpoint
  echo "host: $(nproc) cores; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1);" \
    "vLLM $($ENGINE_PY -c 'import vllm; print(vllm.__version__)')" | tee "$OUT/host.txt"
}

start_backend() {  # LOG READY_PATTERN ARGS...: `python -m backend ARGS` in the background until it
  # prints READY_PATTERN (at most 15 minutes); shows the key lines; 0 once ready
  local log=$1 ready=$2; shift 2
  $B "$@" > "$log" 2>&1 &
  STARTED+=($!)
  for _ in $(seq 450); do
    grep -q "$ready" "$log" && break
    grep -q "^error:" "$log" && break
    kill -0 "${STARTED[-1]}" 2>/dev/null || break
    sleep 2
  done
  grep -h "^plan:\|^ready:\|^chat:\|^error:\|^warm-up:\|^router:\|^engine " "$log" | cut -c1-400
  grep -q "$ready" "$log"
}

wait_health() {  # URL [PID]: until /health answers (at most 15 minutes; not once PID, by default the server
  # last started, has exited)
  local pid=${2:-${STARTED[-1]}}
  for _ in $(seq 450); do
    kill -0 "$pid" 2>/dev/null || return 1
    .venv/bin/python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)" "$1" \
      2>/dev/null && return 0
    sleep 2
  done
  return 1
}

vbench() {  # NAME URL SERVED C:RUN...: vLLM's own `vllm bench serve` (vbench_many.py: all runs in one
  # process), random 512 in / 128 out, max(32, 4C) requests, a line each in summary.txt
  local name=$1 url=$2 served=$3; shift 3
  $ENGINE_PY benchmarks/vbench_many.py "$OUT" "$DIR" "$name" "$url" "$served" "$@"
}

levels() {  # RUNS LEVEL...: "C:RUN" for every level and run 1..RUNS, levels in turn, after a warm level of 16
  local runs=$1 c r; shift
  echo -n "16:warm"
  for r in $(seq "$runs"); do for c in "$@"; do echo -n " $c:$r"; done; done
}
