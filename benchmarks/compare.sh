#!/usr/bin/env bash
# Two setups answering one user through the chat page, on one GPU: `up --compare defaults` (the plan and
# `vllm serve DIR` with vLLM's defaults, each on half of the GPU's memory share and half the cores), then
# MESSAGES (20) messages of REPLY_TOKENS (128) tokens through the page's socket at one user, each answered
# by both setups one after the other (the first alternating), then the chat's /latency: per reply its
# setup, TTFT and its parts, TPOT and tokens/s (latency.csv, latency.json), and the panel with each setup's
# p50/p90/p99 and the ratio of medians (latency.md).
#   COMPARE="KEY=VALUE ..."  the plan with these values pinned instead of vLLM's defaults
#   LEVELS="1 16 64"         also `bench --compare` under load at these concurrencies (bench-compare/)
# Flags after the script go to `up`.
#   OUT=bench-results/compare MESSAGES=20 bash benchmarks/compare.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lib.sh
begin

start_backend "$OUT/up.log" "^chat:" up --model demo --compare "${COMPARE:-defaults}" "$@" || exit 1
grep -h "^ready (" "$OUT/up.log"
$B status --json > "$OUT/status.json"
.venv/bin/python - http://127.0.0.1:8080 "$OUT" "${MESSAGES:-20}" "${REPLY_TOKENS:-128}" <<'PY' || exit 1
import sys
from pathlib import Path

from backend.measure.compare_chat import run

url, out, messages, tokens = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
chat = run(url, messages, tokens)
for name, content in chat.files.items():
    (out / f"latency{Path(name).suffix}").write_bytes(content)
(out / "latency.md").write_text(chat.panel + "\n")
print(chat.panel)
print(f"wrote {out}/latency.csv, latency.json and latency.md: {len(chat.rows())} replies")
if chat.short:
    print(f"note: {len(chat.short)} replies ended before {tokens} tokens: {', '.join(chat.short)}")
PY
if [ -n "${LEVELS:-}" ]; then
  $B bench --compare --concurrency "${LEVELS// /,}" --max-tokens "${REPLY_TOKENS:-128}" --out "$OUT/bench-compare" \
    --label "compare ${COMPARE:-defaults}" 2>&1 | tail -20
fi
