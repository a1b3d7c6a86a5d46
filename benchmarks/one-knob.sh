#!/usr/bin/env bash
# One knob at a time at low load: the plan's own `vllm serve` command and variants that each take one
# knob back to vLLM's default, all started side by side on one GPU (each with the same small memory
# share, so they fit together), then `vllm bench serve` on each, servers and levels interleaved.
#   OUT=bench-results/knobs REPEATS=3 LEVELS="1 16" bash benchmarks/one-knob.sh [plan flags]
# The variants are derived from the plan (`plan --json` for this machine, or [plan flags] such as
# --hardware FILE): defaults, plan, stream interval 1, one API server, vLLM's own graphs, vLLM's
# max_num_seqs. Feeds BENCHMARKS.md, "Low load, one knob at a time".
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lib.sh
begin
REPEATS=${REPEATS:-3}
LEVELS=${LEVELS:-1 16}
SHARE=(--gpu-memory-utilization 0.14 --kv-cache-memory-bytes 4294967296)  # the same for every server

# name|vLLM flags, one line per server: the plan's flags less one knob each
$B plan --json "$@" >"$OUT/plan.json"
.venv/bin/python - "$OUT/plan.json" >"$OUT/servers.txt" <<'PY'
import json, shlex, sys
argv = json.load(open(sys.argv[1]))["commands"][0]["argv"]
rest = argv[argv.index("serve") + 2:]  # after the model path


def without(name, flags):
    """``flags`` less ``name`` and its value."""
    i = flags.index(name) if name in flags else len(flags)
    return flags[:i] + flags[i + 2:]


flags = rest
for own in ("--served-model-name", "--host", "--port", "--gpu-memory-utilization"):  # the script's own
    flags = without(own, flags)

print("defaults|")
print("plan|" + shlex.join(flags))
for name, knob in (("si1", "--stream-interval"), ("api1", "--api-server-count"),
                   ("graphs", "--compilation-config"), ("seqs", "--max-num-seqs")):
    print(f"{name}|" + shlex.join(without(knob, flags)))
PY
port=8100
declare -A URL
while IFS='|' read -r name flags; do
  port=$((port + 1))
  eval "$ENGINE_PY -m vllm.entrypoints.cli.main serve $DIR --port $port ${SHARE[*]} $flags" >"$OUT/$name-server.log" 2>&1 &
  STARTED+=($!)
  URL[$name]=http://127.0.0.1:$port
  sleep 3
done <"$OUT/servers.txt"
for name in "${!URL[@]}"; do
  until curl -sf "${URL[$name]}/health" >/dev/null; do sleep 1; done
  echo "$name healthy"
done
names=$(cut -d'|' -f1 "$OUT/servers.txt")
for name in $names; do $ENGINE_PY benchmarks/vbench_many.py "$OUT" "$DIR" "$name" "${URL[$name]}" "$DIR" 16:warm; done
for run in $(seq "$REPEATS"); do
  for c in $LEVELS; do
    for name in $names; do $ENGINE_PY benchmarks/vbench_many.py "$OUT" "$DIR" "$name" "${URL[$name]}" "$DIR" "$c:$run"; done
  done
done
.venv/bin/python benchmarks/vs_defaults_summary.py "$OUT"
