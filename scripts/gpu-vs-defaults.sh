#!/usr/bin/env bash
# On a GPU host (.gpu/ carried, and .whl/ with the router; see scripts/gpu-host.sh): vLLM's own
# `vllm bench serve` against the project's plan (`serve`: its engines behind the router) and
# against `vllm serve DIR` with vLLM's defaults, in the same call, REPEATS runs per level (levels
# interleaved: 128, 256, 128, 256, ...). Every server gets one unmeasured level of 16 first.
# VARIANT="name:flag flag ..." adds a second project plan (e.g. "mps:--set gpu_sharing=mps"),
# measured after the defaults; DEFAULTS=0 leaves `vllm serve` out (the plan against the variant),
# PROJECT=0 the plan. VARIANT_EXTRA_ARGS (a JSON list) adds vLLM flags the plan does not set to the
# variant's engines only, e.g. '["--compilation-config", "{\"cudagraph_mode\": \"FULL\"}"]'.
# If start-up stalls, every vLLM process's Python stack goes to diagnose.txt (py-spy).
# PROFILE=1: after each server's levels, 6 more runs of each level while `top` samples every
# process's CPU, py-spy records each engine core (raw stacks: NAME-cC-pyspy-*.txt) and nvidia-smi
# the GPU's use.
# TRACE=1: the plan's (and the variant's) engines start with vLLM's torch profiler configured
# (`--profiler-config`, VLLM_CUSTOM_SCOPES_FOR_PROFILING=1; off until asked); after the levels,
# under TRACE_LEVEL (128) concurrent, every engine records TRACE_STEPS (40) steps at once after 20
# more: NAME-trace/*.pt.trace.json.gz, read by scripts/trace_summary.py (NAME-trace.jsonl, .png).
#   OUT=/tmp/r REPEATS=3 LEVELS="128 256" bash scripts/gpu-vs-defaults.sh [serve flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
REPEATS=${REPEATS:-3}
read -ra LV <<< "${LEVELS:-128 256}"

project() {  # NAME serve-flags...: the project's plan as `serve` starts it, measured, stopped
  local name=$1 extra=${ERNIECHAT_ENGINE__EXTRA_ARGS:-[]} scopes=0; shift
  if [ "${TRACE:-0}" = 1 ]; then extra=$(profiler_args "$extra" "$RES/$name-trace"); scopes=1; fi
  if ERNIECHAT_ENGINE__EXTRA_ARGS=$extra VLLM_CUSTOM_SCOPES_FOR_PROFILING=$scopes \
    start_backend "$RES/$name-serve.log" "^ready:" serve --model demo --users 256 "$@"; then
    $G status --json > "$RES/$name-status.json"
    nvidia-smi > "$RES/$name-nvidia-smi.txt" 2>&1  # under MPS: its server holds the GPU, the engines are its clients
    vbench "$name" http://127.0.0.1:8000 demo $(levels "$REPEATS" "${LV[@]}")
    [ "${PROFILE:-0}" = 1 ] && profile "$name" http://127.0.0.1:8000 demo
    [ "${TRACE:-0}" = 1 ] && trace "$name"
  fi
  cp -r /tmp/erniechat-run/mps-log "$RES/$name-mps-log" 2>/dev/null
  gpu_clean; save_results
}

profile() {  # NAME URL SERVED: where the time goes at each measured level (6 runs each; the client
  # imports vLLM first, 10-25 s, so the sampling starts once run p1 is done): every process's CPU
  # (top), each engine core's Python stacks (py-spy, raw), the GPU's use every 100 ms (nvidia-smi)
  local name=$1 url=$2 served=$3 c pid i pids
  for c in "${LV[@]}"; do
    pids=()
    vbench "$name-prof" "$url" "$served" "$c:p1" "$c:p2" "$c:p3" "$c:p4" "$c:p5" "$c:p6" &
    pids+=($!)
    wait_run "$name-prof" "$c" p1
    ps -eo pid,nlwp,args | grep -E "VLLM|vllm|router" | grep -v grep | cut -c1-200 > "$RES/$name-c$c-procs.txt"
    i=0
    for pid in $(pgrep -f "EngineCore|VLLM::Worker"); do
      i=$((i + 1))
      timeout 20 py-spy record --pid "$pid" --duration 6 --rate 200 --nonblocking --format raw \
        --output "$RES/$name-c$c-pyspy-$i.txt" > "$RES/$name-c$c-pyspy-$i.log" 2>&1 &
      pids+=($!)
    done
    timeout 6 nvidia-smi "${CLOCK_QUERY[@]}" -lms 100 > "$RES/$name-c$c-gpu.csv" 2>&1 &
    pids+=($!)
    top -b -d 1 -n 6 -w 250 -c > "$RES/$name-c$c-top.txt" 2>&1
    wait "${pids[@]}"  # not serve's own job
  done
}

wait_run() {  # NAME C RUN: until vbench's line for that run is in summary.txt (at most 60 s): the load is on
  for _ in $(seq 120); do grep -q "^$1 *c= *$2 run $3:" "$RES/summary.txt" 2>/dev/null && return; sleep 0.5; done
}

profiler_args() {  # EXTRA_ARGS DIR: the engines' extra args (a JSON list) and vLLM's torch profiler writing to DIR
  python3 -c 'import json, sys
config = {"profiler": "torch", "torch_profiler_dir": sys.argv[2], "torch_profiler_with_stack": False,
          "ignore_frontend": True, "delay_iterations": 20, "max_iterations": int(sys.argv[3])}
print(json.dumps(json.loads(sys.argv[1]) + ["--profiler-config", json.dumps(config)]))' "$1" "$2" "${TRACE_STEPS:-40}"
}

trace() {  # NAME: every engine of the running plan records its steps at once, under load, then the summary
  local name=$1 c=${TRACE_LEVEL:-128} urls load
  urls=$(python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))
print(" ".join(e["url"] for e in s.get("engines") or []) or s["base_url"].removesuffix("/v1"))' "$RES/$name-status.json")
  vbench "$name-trace" http://127.0.0.1:8000 demo "$c:t1" "$c:t2" "$c:t3" &
  load=$!
  wait_run "$name-trace" "$c" t1
  post_all /start_profile $urls
  wait "$load"  # not serve's own job
  post_all /stop_profile $urls
  sleep 5  # the last trace is written as the profiler stops
  ls -la "$RES/$name-trace" > "$RES/$name-trace-files.txt" 2>&1
  python3 scripts/trace_summary.py --png "$RES/$name-trace.png" "$RES/$name-trace"/*.pt.trace.json* \
    > "$RES/$name-trace.jsonl" 2>&1
  cat "$RES/$name-trace.jsonl" | cut -c1-600
}

post_all() {  # PATH URL...: POST PATH to every URL at once (each engine's own API server)
  python3 -c 'import sys, threading, urllib.request as u
def post(url):
    try:
        u.urlopen(u.Request(url + sys.argv[1], method="POST"), timeout=120)
    except OSError as err:
        print(f"{url}{sys.argv[1]}: {err}")
ts = [threading.Thread(target=post, args=(x,)) for x in sys.argv[2:]]
[t.start() for t in ts]
[t.join() for t in ts]' "$@"
}

gpu_begin
echo "host: $(nproc) cores; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"
[ "${PROJECT:-1}" != 0 ] && project project "$@"
if [ "${DEFAULTS:-1}" != 0 ]; then
  python3 -m vllm.entrypoints.cli.main serve "$DIR" --port 8100 > "$RES/defaults-server.log" 2>&1 &
  if wait_health http://127.0.0.1:8100; then
    vbench defaults http://127.0.0.1:8100 "$DIR" $(levels "$REPEATS" "${LV[@]}")
    [ "${PROFILE:-0}" = 1 ] && profile defaults http://127.0.0.1:8100 "$DIR"
  else echo "defaults: not healthy"; tail -20 "$RES/defaults-server.log"; fi
  gpu_clean; save_results
fi
if [ -n "${VARIANT:-}" ]; then
  read -ra flags <<< "${VARIANT#*:}"
  ERNIECHAT_ENGINE__EXTRA_ARGS=${VARIANT_EXTRA_ARGS:-[]} project "${VARIANT%%:*}" "${flags[@]}"
fi
