"""Spreading a level over client processes: how many, how the load is split and merged."""

from __future__ import annotations

from typing import Any

import pytest

from backend.engine_api import ChatResult
from backend.errors import MeasureError
from backend.measure.levels import Load, Target, direct_span
from backend.measure.loadgen import Span, client_processes, fan_out, merge, split


def test_client_processes_grow_with_load_and_cores_not_on_small_machines() -> None:
    assert client_processes(64, cpus=2) == 1, "CI's 2 cores belong to the engine"
    assert client_processes(4, cpus=32) == 1, "four streams do not need a second process"
    assert client_processes(32, cpus=16) == 4 and client_processes(32, cpus=32) == 4
    assert client_processes(1024, cpus=128) == 8


def test_split_and_merge_keep_every_request_and_the_whole_span() -> None:
    assert split(16, 3) == [6, 5, 5] and sum(split(7, 4)) == 7 and split(2, 4) == [1, 1]
    a = Span([ChatResult(tokens=3)], start=10.0, end=12.0, cut_off=1, cpu_s=1.0)
    b = Span([ChatResult(tokens=4), ChatResult(tokens=5)], start=10.5, end=14.0, cut_off=0, cpu_s=3.15)
    m = merge([a, b])
    assert [r.tokens for r in m.results] == [3, 4, 5]
    assert (m.start, m.end, m.cut_off) == (10.0, 14.0, 1)
    assert m.busy == pytest.approx(0.9), "the busiest process's share (b: 3.15 s of 3.5 s)"
    assert m.cpu_s == pytest.approx(4.15), "both processes' CPU seconds"


def test_a_failing_client_process_is_reported_not_waited_for() -> None:
    with pytest.raises(MeasureError, match="1 of 2 client processes: TypeError"):
        fan_out(direct_span, [{"bad": 1}, {**GOOD_JOB, "concurrency": 1, "n_requests": 1}], timeout_s=30)


GOOD_JOB: dict[str, Any] = {
    "target": Target("http://127.0.0.1:9/v1", "m"),  # nothing listens: the request fails fast, the process does not
    "load": Load(max_tokens=1, prompt_words=(1,), keepalive=False, time_cap_s=5.0, drain_s=1.0),
}
