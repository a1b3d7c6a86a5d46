#!/usr/bin/env bash
# One command: install what is needed, then the engine and the chat page on this machine.
# Arguments go to `python -m backend up` (e.g. --model DIR, --port 8080, --objective latency).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m backend up "$@"
