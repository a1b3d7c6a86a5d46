"""The performance model: what a plan delivers under a load (TTFT, TPOT, tokens/s) and what bounds it.

- ``costs``: the host's CPU costs per step, token and request (defaults, or calibrated on this machine), and
  vLLM's Rust frontend's as shares of a Python API server's.
- ``layout``: what the model reads of a plan, or of ``vllm serve``'s defaults on the same hardware (its Python
  API server, or on a GPU its Rust frontend).
- ``step``: one engine step's time, host against device; ``simulate``: engine cores under their users.
- ``prediction``: the prediction, its band and its bound; ``calibrate``: the host's costs from a warm-up.
- ``text``: the prediction as lines for ``plan``, ``status`` and the page.
"""

from config.performance.costs import (
    CPU_HOST_DEFAULTS,
    GPU_HOST_DEFAULTS,
    RUST_FRONTEND_SHARES,
    HostCosts,
    RustFrontendShares,
    default_costs,
)
from config.performance.layout import Layout, layout_of, vllm_defaults
from config.performance.prediction import BOUNDS, Figure, Load, Prediction, predict

__all__ = [
    "BOUNDS",
    "CPU_HOST_DEFAULTS",
    "GPU_HOST_DEFAULTS",
    "RUST_FRONTEND_SHARES",
    "Figure",
    "HostCosts",
    "Layout",
    "Load",
    "Prediction",
    "RustFrontendShares",
    "default_costs",
    "layout_of",
    "predict",
    "vllm_defaults",
]
