#!/usr/bin/env bash
# One knob at a time at low load: the plan's own `vllm serve` command and variants that each move one
# value, all started side by side on one GPU (each with the same small memory share, so they fit
# together), then `vllm bench serve` on each, servers and levels interleaved.
#   OUT=bench-results/knobs REPEATS=3 LEVELS="1 16" bash benchmarks/one-knob.sh [plan flags]
# Servers, one per line of VARIANTS ("NAME|KIND|ARGS"; the default list below):
#   NAME|vllm|[VAR=VALUE ...] [FLAGS]  `vllm serve DIR FLAGS` as a vLLM user types it, with that environment
#   NAME|plan|[VAR=VALUE ...] [PINS]   the plan (`plan --json [plan flags] PINS`): its vLLM flags and environment,
#                                      and that environment besides
# CHECK=1 runs benchmarks/frontend_check.py on every server first (NAME-frontend.jsonl); DEADLINE_S stops
# measuring that many seconds after the start (the runs left are listed as skipped). Feeds BENCHMARKS.md,
# "Low load, one knob at a time" and "Rust frontend".
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lib.sh
begin
REPEATS=${REPEATS:-3}
LEVELS=${LEVELS:-1 16}
SHARE=(--gpu-memory-utilization "${SHARE_UTIL:-0.12}" --kv-cache-memory-bytes 4294967296)  # the same for every server
VARIANTS=${VARIANTS:-"defaults|vllm|
defaults-rust|vllm|VLLM_USE_RUST_FRONTEND=1
plan|plan|
python|plan|--set rust_frontend=false
graphs|plan|--set cudagraph_mode=auto --set max_cudagraph_capture_size=0
seqs|plan|--set max_num_seqs=1024"}

: >"$OUT/servers.txt"
while IFS='|' read -r name kind args; do
  [ -n "$name" ] || continue
  read -ra words <<<"$args"
  envs=() flags=()
  for w in "${words[@]}"; do if [[ $w =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$w"); else flags+=("$w"); fi; done
  if [ "$kind" = plan ]; then
    $B plan --json "$@" "${flags[@]}" >"$OUT/$name-plan.json"
    # NAME|environment|flags: the plan's first engine less what this script sets itself
    .venv/bin/python - "$OUT/$name-plan.json" "$name" "${envs[@]}" >>"$OUT/servers.txt" <<'PY'
import json, shlex, sys
command = json.load(open(sys.argv[1]))["commands"][0]
argv, env = command["argv"], command["env"] | dict(w.split("=", 1) for w in sys.argv[3:])
flags = argv[argv.index("serve") + 2:]  # after the model path
for own in ("--served-model-name", "--host", "--port", "--gpu-memory-utilization", "--kv-cache-memory-bytes"):
    if own in flags:
        i = flags.index(own)
        flags = flags[:i] + flags[i + 2:]
env.pop("CUDA_VISIBLE_DEVICES", None)
print(f"{sys.argv[2]}|{' '.join(f'{k}={shlex.quote(v)}' for k, v in sorted(env.items()))}|{shlex.join(flags)}")
PY
  else
    echo "$name|${envs[*]}|${flags[*]}" >>"$OUT/servers.txt"
  fi
done <<<"$VARIANTS"

port=8100
names=() urls=()
while IFS='|' read -r name envs flags; do
  port=$((port + 1))
  eval "env $envs $ENGINE_PY -m vllm.entrypoints.cli.main serve $DIR --port $port ${SHARE[*]} $flags" \
    >"$OUT/$name-server.log" 2>&1 &
  STARTED+=($!)
  names+=("$name") urls+=("http://127.0.0.1:$port")
  sleep 3
done <"$OUT/servers.txt"
for i in "${!names[@]}"; do
  if wait_health "${urls[$i]}" "${STARTED[$i]}"; then
    echo "${names[$i]} healthy after $SECONDS s"
  else
    echo "${names[$i]}: not healthy"; tail -5 "$OUT/${names[$i]}-server.log"
  fi
done
if [ "${CHECK:-0}" = 1 ]; then
  for i in "${!names[@]}"; do
    { .venv/bin/python benchmarks/frontend_check.py "${urls[$i]}" "$DIR" --out "$OUT/${names[$i]}-frontend.jsonl" || true; } |
      tail -1 | sed "s/^/${names[$i]}: /"
  done
fi
[ -n "${DEADLINE_S:-}" ] && export VBENCH_DEADLINE=$(($(date +%s) + DEADLINE_S - SECONDS))
join() { local IFS=,; echo "$*"; }
served=$(for _ in "${names[@]}"; do echo "$DIR"; done | paste -sd,)
vbench "$(join "${names[@]}")" "$(join "${urls[@]}")" "$served" $(levels "$REPEATS" $LEVELS)
.venv/bin/python benchmarks/vs_defaults_summary.py "$OUT"
