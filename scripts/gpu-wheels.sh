#!/usr/bin/env bash
# Here (with a package index), before the GPU-host calls: fill .whl/ with what the GPU host lacks
# for the page, the router and profiling: what requirements.txt resolves to, less what is
# in the host's image (KINDS.md's list) or in the vLLM bundle (../shared/gpu/deps.txt),
# as cp312 manylinux wheels (the few published only as sources built here with `pip wheel`:
# pure Python), py-spy, and the vllm-router wheel unpacked, its library stripped and xz'd as
# router-site.tar.xz (the wheel, 24 MB, and the bundle, 49 MiB, do not fit one call's 64 MiB).
# scripts/gpu-stage-extra.sh installs them there. About 36 MB in all.
#   bash scripts/gpu-wheels.sh [KINDS.md] [deps.txt]
set -euo pipefail
cd "$(dirname "$0")/.."
kinds=${1:-/work/.library/device/KINDS.md}
deps=${2:-../shared/gpu/deps.txt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
router=$(grep -i '^vllm-router==' requirements.txt)

.venv/bin/python -m pip install -q --disable-pip-version-check --dry-run --ignore-installed \
  --report "$tmp/report.json" -r requirements.txt 2> >(grep -v "^WARNING: Location" >&2)
python3 -c '
import json, sys
kinds, deps, router = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
norm = lambda n: n.strip().lower().replace("_", "-")
have = {norm(n) for n in kinds.split("Packages: ", 1)[1].split(".\n")[0].split(",")}
have |= {norm(line.split("==")[0]) for line in deps.splitlines() if "==" in line}
have.add(norm(router.split("==")[0]))
for item in json.load(open(sys.argv[4]))["install"]:
    meta = item["metadata"]
    if norm(meta["name"]) not in have:
        print(meta["name"] + "==" + meta["version"])
print("py-spy")' "$kinds" "$deps" "$router" "$tmp/report.json" > "$tmp/need.txt"

platforms=""
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do platforms="$platforms --platform ${p}_x86_64"; done
mkdir -p "$tmp/whl"
while read -r req; do
  # shellcheck disable=SC2086
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $platforms -d "$tmp/whl" "$req" >/dev/null 2>&1 ||
    python3 -m pip wheel -q --disable-pip-version-check --no-deps -w "$tmp/whl" "$req" >/dev/null 2>&1 ||
    { echo "gpu-wheels: neither a cp312 wheel nor a build for $req" >&2; exit 1; }
done < "$tmp/need.txt"

# shellcheck disable=SC2086
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp $platforms -d "$tmp/router" "$router" >/dev/null
mkdir -p "$tmp/site"
(cd "$tmp/site" && python3 -m zipfile -e "$tmp"/router/*.whl . && find . -name "*.so" -exec strip --strip-unneeded {} \;)
rm -rf .whl && mkdir .whl
cp "$tmp"/whl/*.whl .whl/
tar -cJf .whl/router-site.tar.xz -C "$tmp/site" .
echo "gpu-wheels: $(ls .whl/*.whl | wc -l) wheels and router-site.tar.xz in .whl/ ($(du -sh .whl | cut -f1))"
