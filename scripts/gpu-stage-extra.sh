# Source on the GPU host after .gpu/stage.sh: install what .whl/ carries (wheels, and site-dir
# tarballs *.tar.xz) into one site dir, once per machine, and put it on PYTHONPATH and PATH.
# The vllm-router wheel (24 MB) and the vLLM bundle (49 MiB) together exceed what one device
# call carries (64 MiB); its stripped site dir, xz'd, is ~13 MB.
_extra=${ERNIECHAT_EXTRA_SITE:-/tmp/erniechat-site}
if [ -d .whl ] && [ ! -f "$_extra/.done" ]; then
  mkdir -p "$_extra"
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$_extra" .whl/*.whl
  fi
  for _t in .whl/*.tar.xz; do [ -e "$_t" ] && tar -xJf "$_t" -C "$_extra"; done
  touch "$_extra/.done"
fi
export PYTHONPATH=$_extra${PYTHONPATH:+:$PYTHONPATH} PATH=$_extra/bin:$PATH
