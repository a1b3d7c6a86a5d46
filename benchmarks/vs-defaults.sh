#!/usr/bin/env bash
# vLLM's own `vllm bench serve` against the project's plan (`serve`: its engines, behind the router
# when there are several) and against `vllm serve DIR` with vLLM's defaults, on one machine in one
# run, REPEATS runs per level, levels interleaved (128, 256, 128, 256, ...). Every server gets one
# unmeasured level of 16 first. Flags after the script go to `serve` (e.g. --users 256).
#   THROUGHPUT=1   also `vllm serve DIR --performance-mode throughput`
#   DEFAULTS=0     leaves `vllm serve` out; PROJECT=0 leaves the plan out
#   VARIANT="name:flag flag ..."  a second plan with its own `serve` flags, measured last
#                  (e.g. "two:--users 256 --set engines_per_gpu=2"); VARIANT_EXTRA_ARGS (a JSON
#                  list) adds vLLM flags to the variant's engines only
#   TRACE=1        the plan's engines start with vLLM's torch profiler; under TRACE_LEVEL (128)
#                  concurrent every engine records TRACE_STEPS (40) steps at once; trace_summary.py
#                  reads them (NAME-trace.jsonl, NAME-trace.png)
# Then: .venv/bin/python benchmarks/vs_defaults_summary.py $OUT   (medians, spread, vs-defaults.png)
#   OUT=bench-results/vs REPEATS=3 LEVELS="128 256" bash benchmarks/vs-defaults.sh --users 256
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lib.sh
REPEATS=${REPEATS:-3}
read -ra LV <<< "${LEVELS:-128 256}"

project() {  # NAME serve-flags...: the project's plan as `serve` starts it, measured, stopped
  local name=$1 extra=${ERNIECHAT_ENGINE__EXTRA_ARGS:-[]} scopes=0; shift
  if [ "${TRACE:-0}" = 1 ]; then extra=$(profiler_args "$extra" "$OUT/$name-trace"); scopes=1; fi
  if ERNIECHAT_ENGINE__EXTRA_ARGS=$extra VLLM_CUSTOM_SCOPES_FOR_PROFILING=$scopes \
    start_backend "$OUT/$name-serve.log" "^ready:" serve --model demo "$@"; then
    $B status --json > "$OUT/$name-status.json"
    nvidia-smi > "$OUT/$name-nvidia-smi.txt" 2>&1  # under MPS: its server holds the GPU, the engines are its clients
    vbench "$name" http://127.0.0.1:8000 demo $(levels "$REPEATS" "${LV[@]}")
    [ "${TRACE:-0}" = 1 ] && trace "$name"
  fi
  stop_all
}

vllm_serve() {  # NAME vllm-flags...: `vllm serve DIR` as a vLLM user starts it, measured, stopped
  local name=$1; shift
  .venv-engine/bin/vllm serve "$DIR" --port 8100 "$@" > "$OUT/$name-server.log" 2>&1 &
  STARTED+=($!)
  if wait_health http://127.0.0.1:8100; then
    vbench "$name" http://127.0.0.1:8100 "$DIR" $(levels "$REPEATS" "${LV[@]}")
  else
    echo "$name: not healthy"; tail -20 "$OUT/$name-server.log"
  fi
  stop_all
}

wait_run() {  # NAME C RUN: until vbench's line for that run is in summary.txt (at most 60 s): the load is on
  for _ in $(seq 120); do grep -q "^$1 *c= *$2 run $3:" "$OUT/summary.txt" 2>/dev/null && return; sleep 0.5; done
}

profiler_args() {  # EXTRA_ARGS DIR: the engines' extra args (a JSON list) and vLLM's torch profiler writing to DIR
  .venv/bin/python -c 'import json, sys
config = {"profiler": "torch", "torch_profiler_dir": sys.argv[2], "torch_profiler_with_stack": False,
          "ignore_frontend": True, "delay_iterations": 20, "max_iterations": int(sys.argv[3])}
print(json.dumps(json.loads(sys.argv[1]) + ["--profiler-config", json.dumps(config)]))' "$1" "$2" "${TRACE_STEPS:-40}"
}

trace() {  # NAME: every engine of the running plan records its steps at once, under load, then the summary
  local name=$1 c=${TRACE_LEVEL:-128} urls load
  urls=$(.venv/bin/python -c 'import json, sys
s = json.load(open(sys.argv[1]))
print(" ".join(e["url"] for e in s.get("engines") or []) or s["base_url"].removesuffix("/v1"))' "$OUT/$name-status.json")
  vbench "$name-trace" http://127.0.0.1:8000 demo "$c:t1" "$c:t2" "$c:t3" &
  load=$!
  wait_run "$name-trace" "$c" t1
  post_all /start_profile $urls
  wait "$load"
  post_all /stop_profile $urls
  sleep 5  # the last trace is written as the profiler stops
  .venv/bin/python benchmarks/trace_summary.py --png "$OUT/$name-trace.png" "$OUT/$name-trace"/*.pt.trace.json* \
    > "$OUT/$name-trace.jsonl" 2>&1
  cut -c1-600 "$OUT/$name-trace.jsonl"
}

post_all() {  # PATH URL...: POST PATH to every URL at once (each engine's own API server)
  .venv/bin/python -c 'import sys, threading, urllib.request as u
def post(url):
    try:
        u.urlopen(u.Request(url + sys.argv[1], method="POST"), timeout=120)
    except OSError as err:
        print(f"{url}{sys.argv[1]}: {err}")
ts = [threading.Thread(target=post, args=(x,)) for x in sys.argv[2:]]
[t.start() for t in ts]
[t.join() for t in ts]' "$@"
}

begin
[ "${PROJECT:-1}" != 0 ] && project project "$@"
[ "${DEFAULTS:-1}" != 0 ] && vllm_serve defaults
[ "${THROUGHPUT:-0}" = 1 ] && vllm_serve throughput --performance-mode throughput
if [ -n "${VARIANT:-}" ]; then
  read -ra flags <<< "${VARIANT#*:}"
  ERNIECHAT_ENGINE__EXTRA_ARGS=${VARIANT_EXTRA_ARGS:-[]} project "${VARIANT%%:*}" "${flags[@]}"
fi
