#!/usr/bin/env bash
# vLLM's own `vllm bench serve` against the project's plan (`serve`: its engines, behind the router
# when there are several) and against `vllm serve DIR` with vLLM's defaults, on one machine in one
# run, REPEATS runs per level, levels interleaved (128, 256, 128, 256, ...). Every server gets one
# unmeasured level of 16 first. Flags after the script go to `serve` (e.g. --users 256).
#   THROUGHPUT=1   also `vllm serve DIR --performance-mode throughput`
#   RUST=1         also `vllm serve DIR` with vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND=1), nothing else
#   DEFAULTS=0     leaves `vllm serve` out; PROJECT=0 leaves the plan out
#   VARIANT="name:flag flag ..."  a second plan with its own `serve` flags, measured last
#                  (e.g. "two:--users 256 --set engines_per_gpu=2"; several: "a:...;b:..."; VAR=VALUE words
#                  set the variant's environment); VARIANT_EXTRA_ARGS
#                  (a JSON list) adds vLLM flags to the variants' engines only
#   DEADLINE_S=N   no server is started, and no run begins, N seconds after the start (listed as skipped)
#   TRACE=1        the plan's engines start with vLLM's torch profiler; under TRACE_LEVEL (128)
#                  concurrent every engine records TRACE_STEPS (40) steps at once; trace_summary.py
#                  reads them (NAME-trace.jsonl, NAME-trace.png)
# Start-up: each server's seconds from launch to `ready:` (the plan) or to /health (vLLM) in startup.txt.
# Then: .venv/bin/python benchmarks/vs_defaults_summary.py $OUT   (medians, spread, vs-defaults.png)
#   OUT=bench-results/vs REPEATS=3 LEVELS="128 256" bash benchmarks/vs-defaults.sh --users 256
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lib.sh
REPEATS=${REPEATS:-3}
read -ra LV <<< "${LEVELS:-128 256}"

project() {  # NAME serve-flags...: the project's plan as `serve` starts it, measured, stopped
  local name=$1 extra=${ERNIECHAT_ENGINE__EXTRA_ARGS:-[]} scopes=0; shift
  late "$name" && return
  if [ "${TRACE:-0}" = 1 ]; then extra=$(profiler_args "$extra" "$OUT/$name-trace"); scopes=1; fi
  local t0=$SECONDS
  if ERNIECHAT_ENGINE__EXTRA_ARGS=$extra VLLM_CUSTOM_SCOPES_FOR_PROFILING=$scopes \
    start_backend "$OUT/$name-serve.log" "^ready:" serve --model demo "$@"; then
    echo "$name ready after $((SECONDS - t0)) s" | tee -a "$OUT/startup.txt"
    $B status --json > "$OUT/$name-status.json"
    nvidia-smi > "$OUT/$name-nvidia-smi.txt" 2>&1  # under MPS: its server holds the GPU, the engines are its clients
    vbench "$name" http://127.0.0.1:8000 demo $(levels "$REPEATS" "${LV[@]}")
    [ "${TRACE:-0}" = 1 ] && trace "$name"
  fi
  stop_all
}

vllm_serve() {  # NAME vllm-flags...: `vllm serve DIR` as a vLLM user starts it, measured, stopped
  local name=$1; shift
  late "$name" && return
  .venv-engine/bin/vllm serve "$DIR" --port 8100 "$@" > "$OUT/$name-server.log" 2>&1 &
  STARTED+=($!)
  local t0=$SECONDS
  if wait_health http://127.0.0.1:8100; then
    echo "$name healthy after $((SECONDS - t0)) s" | tee -a "$OUT/startup.txt"
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

late() {  # NAME: whether DEADLINE_S has passed (then NAME is listed as skipped)
  [ -n "${DEADLINE_S:-}" ] && [ "$SECONDS" -ge "$DEADLINE_S" ] && echo "$1: skipped (deadline)" | tee -a "$OUT/summary.txt"
}

begin
[ -n "${DEADLINE_S:-}" ] && export VBENCH_DEADLINE=$(($(date +%s) + DEADLINE_S - SECONDS))
[ "${PROJECT:-1}" != 0 ] && project project "$@"
[ "${DEFAULTS:-1}" != 0 ] && vllm_serve defaults
[ "${RUST:-0}" = 1 ] && VLLM_USE_RUST_FRONTEND=1 vllm_serve defaults-rust
[ "${THROUGHPUT:-0}" = 1 ] && vllm_serve throughput --performance-mode throughput
IFS=';' read -ra variants <<< "${VARIANT:-}"
for variant in "${variants[@]}"; do
  read -ra words <<< "${variant#*:}"
  envs=() flags=()  # VAR=VALUE words: the variant's environment (its engines inherit it)
  for w in "${words[@]}"; do if [[ $w =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$w"); else flags+=("$w"); fi; done
  ([ ${#envs[@]} = 0 ] || export "${envs[@]}"; ERNIECHAT_ENGINE__EXTRA_ARGS=${VARIANT_EXTRA_ARGS:-[]} project "${variant%%:*}" "${flags[@]}")
done
