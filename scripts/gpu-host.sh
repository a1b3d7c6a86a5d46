#!/usr/bin/env bash
# On an offline NVIDIA GPU host that has python3 + torch but no vLLM and no package index:
# stage the vLLM bundle carried in .gpu/ (built here by ../shared/gpu/build_bundle.sh) and the
# packages carried in .whl/ (wheels, and site-dir tarballs *.tar.xz such as the stripped
# vllm-router), point the project at the host's python3, and run `python -m backend ARGS`
# with the full-size demo model as the default. Used for the GPU figures in BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source .gpu/stage.sh
source scripts/gpu-stage-extra.sh
export ERNIECHAT_ENGINE__PYTHON=python3
export ERNIECHAT_MODEL__DEMO_FULL_SIZE=${ERNIECHAT_MODEL__DEMO_FULL_SIZE:-true}
export ERNIECHAT_MODEL__DEMO_DIR=${ERNIECHAT_MODEL__DEMO_DIR:-/tmp/erniechat-demo-full}
export ERNIECHAT_ENGINE__RUN_DIR=${ERNIECHAT_ENGINE__RUN_DIR:-/tmp/erniechat-run}
exec python3 -m backend "$@"
