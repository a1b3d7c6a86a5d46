#!/usr/bin/env bash
# Build the demo image.
#
#   bash deploy/build.sh [--gpu] [--offline] [--tag NAME] [-- EXTRA BUILD ARGS...]
#
# Default (online): deploy/Containerfile (or Containerfile.gpu) from its default base image,
# with Debian's packages and PyPI reached inside the build; podman if installed, else docker
# (CONTAINER_ENGINE=docker picks docker).
#
# --offline (podman only): nothing is pulled from a registry and the build reaches no index:
#   - the base image is made from Debian's packages (mmdebstrap --variant=minbase, then podman
#     import) once, and kept as localhost/erniechat-base:<packages hash>;
#   - the wheels are downloaded on this host, once per requirements (one set per environment:
#     app and engine), into $ERNIECHAT_CACHE (default ~/.cache/erniechat)/wheels/, and mounted
#     into the build (podman build -v DIR:/wheels:ro) for pip install --no-index.
# Needs podman, mmdebstrap and a Python 3.11 with pip on the host (Debian 12's python3 is; the
# image's Python is Debian 12's 3.11). Layers are cached: a rebuild after a code change takes
# seconds, after a requirements change one pip layer.
set -euo pipefail
cd "$(dirname "$0")/.."

variant=cpu offline=0 tag=""
while [ $# -gt 0 ]; do
  case $1 in
    --gpu) variant=gpu ;;
    --offline) offline=1 ;;
    --tag) tag=$2; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
tag=${tag:-localhost/erniechat:$variant}
file=deploy/Containerfile
[ "$variant" = gpu ] && file=deploy/Containerfile.gpu
engine_req=requirements-engine-$variant.txt
cache=${ERNIECHAT_CACHE:-$HOME/.cache/erniechat}
# The Debian packages the Containerfile checks for (its `for p in ...` line) go into the base.
BASE_PACKAGES=$(sed -n 's/.*for p in \(.*\); do.*/\1/p' "$file" | tr ' ' ,)
SUITE=bookworm

tool=${CONTAINER_ENGINE:-}
if [ -z "$tool" ]; then
  if command -v podman >/dev/null; then tool=podman; elif command -v docker >/dev/null; then tool=docker; else
    echo "build: neither podman nor docker is installed (apt-get install podman)" >&2; exit 1
  fi
fi

say() { echo "build: $*" >&2; }
args=(-f "$file" -t "$tag")
[ "$tool" = podman ] && args+=(--format docker)  # OCI images drop HEALTHCHECK

if [ "$offline" = 1 ]; then
  [ "$tool" = podman ] || { echo "build: --offline needs podman (it mounts the wheels into the build)" >&2; exit 1; }
  command -v mmdebstrap >/dev/null || { echo "build: --offline needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }

  # The base: Debian's packages, no registry.
  base=localhost/erniechat-base:$SUITE-$(echo "$SUITE $BASE_PACKAGES" | sha256sum | cut -c1-12)
  if ! podman image exists "$base"; then
    for old in $(podman images --format '{{.Repository}}:{{.Tag}}' localhost/erniechat-base); do podman rmi "$old" >/dev/null 2>&1 || true; done
    say "making the base image $base from Debian's packages (mmdebstrap)"
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" "$SUITE" - \
      "deb http://deb.debian.org/debian $SUITE main" \
      "deb http://deb.debian.org/debian $SUITE-updates main" \
      "deb http://deb.debian.org/debian-security $SUITE-security main" \
      | podman import --quiet - "$base" >/dev/null
  fi

  # The wheels: downloaded here, one resolved set per environment, sdists built to wheels.
  py=${PYTHON:-}
  if [ -z "$py" ]; then
    for candidate in python3.11 python3; do command -v "$candidate" >/dev/null && { py=$candidate; break; }; done
  fi
  [ -n "$py" ] && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
    echo "build: --offline needs Python 3.11 on the host (the image's Python), e.g. PYTHON=python3.11" >&2; exit 1
  }
  key=$(cat requirements.txt "$engine_req" | sha256sum | cut -c1-16)
  wheels=$cache/wheels/$variant-$key
  if [ ! -f "$wheels/.complete" ]; then
    say "downloading the wheels into $wheels (once per requirements)"
    rm -rf "$wheels"
    for entry in "app requirements.txt" "engine $engine_req"; do
      read -r name req <<<"$entry"
      mkdir -p "$wheels/$name"
      "$py" -m pip download -q --disable-pip-version-check -d "$wheels/$name" -r "$req" 2> >(grep -v "^WARNING: Location" >&2)
      sdists=("$wheels/$name"/*.tar.gz)
      if [ -e "${sdists[0]}" ]; then
        "$py" -m pip wheel -q --disable-pip-version-check --no-deps -w "$wheels/$name" "${sdists[@]}" 2> >(grep -v "^WARNING: Location" >&2)
        rm -f "${sdists[@]}"
      fi
    done
    touch "$wheels/.complete"
  fi
  for old in "$cache/wheels/$variant"-*; do [ "$old" = "$wheels" ] || rm -rf "$old"; done
  args+=(--build-arg "BASE=$base" --build-arg WHEELS=/wheels -v "$wheels:/wheels:ro")
fi

say "$tool build ${args[*]} $* ."
t0=$(date +%s)
previous=$("$tool" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
"$tool" build "${args[@]}" "$@" .
now=$("$tool" image inspect --format '{{.Id}}' "$tag")
# the image this tag named before is left untagged: remove it (kept if a container uses it)
[ -n "$previous" ] && [ "$previous" != "$now" ] && "$tool" rmi "$previous" >/dev/null 2>&1 || true
say "built $tag in $(( $(date +%s) - t0 )) s"
