"""The host's costs from the warm-up's own requests: the model is fitted to what this machine just did.

The warm-up sends short, medium and long prompts one at a time and rounds of concurrent requests, with
16-token replies, then a short prompt with a longer reply, alone and several at once. Each cost is set so
that the model gives what was measured, one at a time and in an order where each figure depends mostly on
one cost: the prompts' first-token times against their lengths give the compute rate (the CPU engine's
FLOP/s per core, a GPU's share of its peak), the short prompt's first token the per-request cost (last, as
every other cost moves it), one user's time per output token the per-step cost, and the longer replies'
several at once the per-sequence cost. Twice over, since each fit moves the others a little.

The per-step and per-sequence costs are fitted to how far apart the longer replies' tokens came (the
median gap between streamed chunks, per token), alone and several at once, against the model's step of
one and of that many decoding sequences. A reply's time from its first to its last token also holds the
stream's ends and, with others, their arrivals and prompt reading, which the model charges apart; a
16-token reply's first tokens came slower too (on the 2-core CPU alone: 16-token replies 2.71 ms a token
from first to last and 2.48 ms apart, 64-token replies' tokens 2.09 ms apart; BENCHMARKS.md#prediction).
A warm-up record without the longer replies' gaps is fitted to the 16-token replies, as before.

The longer replies go greedy and drawn as the page draws (its temperature and top-p): the per-step and
per-sequence costs are fitted to the greedy ones, and the draw's own cost per sequence (``sample_us``) to the
drawn replies together against that. On the 2-core CPU the draw cost about 0.4 ms a sequence a step, a fifth of
one user's step: a calibration that took the drawn replies for greedy ones charged it to every request, and
predicted ``bench``'s greedy requests 12-20 % slow (BENCHMARKS.md#prediction). A record without greedy replies
(an older warm-up) is fitted as before, the draw inside the per-step and per-sequence costs.

On a plan with vLLM's Rust frontend the warm-up measured the Rust server: the model charges it its shares
of a Python API server's costs (``RustFrontendShares``), so the per-request cost and the latency are
fitted through them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from pydantic import BaseModel

from config.model import ModelSpec
from config.performance.costs import HostCosts
from config.performance.layout import Layout
from config.performance.prediction import Load, decode_step_s, simulate_load
from config.performance.step import percentile

PASSES = 2
SEQ_RANGE = 4.0
"""The per-sequence cost is fitted within this factor of the default: a round of 16-token replies is mostly
its prompts' reading, so it says little more about it."""
SAMPLE_RANGE = 10.0
SAMPLE_FLOOR_US = 0.01
"""The draw's cost per sequence is fitted between about nothing (a page that draws greedily) and this factor
over the default's (or, where the default is 0, over the per-sequence cost)."""
QUICK = 25
"""The percentile of a shape's repeated samples the calibration fits to (see ``_quick``)."""
BISECTIONS = 24
SINGLE_SHAPES = ("short", "medium", "long")
LONGER_SHAPES = ("reply", "decode")
"""A short prompt with a longer reply: alone, and several at once (the per-sequence cost)."""


class WarmupSample(BaseModel):
    """One warm-up request as measured: its shape, its prompt, how many went with it, and its times."""

    shape: str
    """'short', 'medium', 'long' (alone), 'concurrent' (a round), 'steady' (alone, short); 'reply' (alone,
    short, a longer reply), 'decode' (short prompts together, the longer reply)."""
    prompt_tokens: int
    concurrency: int
    """Requests sent together with it (its round), itself included."""
    round: int = 0
    """Which concurrent round (0 for requests sent alone)."""
    ttft_s: float
    total_s: float
    tokens: int
    gap_s: float | None = None
    """How far apart its tokens came: the median gap between its streamed chunks, over the tokens in one
    (``stream_interval``); None where it streamed fewer than three chunks."""
    sampled: bool = True
    """Its tokens drawn at random (the page's temperature and top-p), not greedily."""

    @property
    def tpot_s(self) -> float | None:
        return (self.total_s - self.ttft_s) / (self.tokens - 1) if self.tokens > 1 else None


class CalibrationError(ValueError):
    """The warm-up did not measure what a calibration needs (it was off, or its requests failed)."""


def _alone(samples: Sequence[WarmupSample], shape: str) -> list[WarmupSample]:
    return [s for s in samples if s.shape == shape and s.concurrency == 1 and s.tokens > 1]


def _quick(values: list[float]) -> float:
    """The lower quartile (of two or three: the least): what a request takes when nothing else holds a core."""
    return percentile(values, QUICK) if len(values) > 3 else min(values)


def _solve(fn: Callable[[float], float], target: float, lo: float, hi: float, rising: bool) -> float:
    """The x in [lo, hi] (geometric bisection) where ``fn(x)`` meets ``target``; ``rising``: fn grows with x."""
    for _ in range(BISECTIONS):
        mid = (lo * hi) ** 0.5
        if (fn(mid) < target) == rising:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


def calibrate(
    layout: Layout,
    model: ModelSpec,
    samples: Sequence[WarmupSample],
    base: HostCosts,
    *,
    measured_on: str,
    measured_at: str,
) -> HostCosts:
    """``base`` with the costs the warm-up's ``samples`` measure refitted on ``layout`` (one engine of the
    run's plan, as each engine is warmed alone). Raises CalibrationError when a figure is missing."""
    singles = {shape: _alone(samples, shape) for shape in SINGLE_SHAPES}
    singles["short"] += _alone(samples, "steady")
    rounds = [s for s in samples if s.shape == "concurrent" and s.tokens > 1]
    if not all(singles.values()):
        raise CalibrationError("the warm-up measured no short, medium and long prompt alone (was it off?)")
    reply = statistics.median_low(s.tokens for v in singles.values() for s in v)
    # The host's own pace, not what other processes left of it: the short prompt went often, its lower
    # quartile; the others went twice, the quicker (the first may have compiled too). A reply's time per
    # token is as often cut short (its tokens held back, then sent at once) as drawn out: the median.
    ttft = {k: _quick([s.ttft_s for s in v]) for k, v in singles.items()}
    prompt = {k: round(statistics.median(s.prompt_tokens for s in v)) for k, v in singles.items()}
    tpot = statistics.median(s.tpot_s or 0.0 for s in singles["short"])
    last = max((s.round for s in rounds), default=0)
    final = [s for s in rounds if s.round == last]
    timed = [s for s in samples if s.shape in LONGER_SHAPES and s.gap_s]
    greedy = {shape: [s for s in timed if s.shape == shape and not s.sampled] for shape in LONGER_SHAPES}
    drawn = {shape: [s for s in timed if s.shape == shape and s.sampled] for shape in LONGER_SHAPES}
    costs = base.model_copy(update={"kind": "calibrated"})
    if not greedy["reply"]:  # an older record: the draw is in the per-step and per-sequence costs
        greedy, drawn = drawn, {shape: [] for shape in LONGER_SHAPES}
        costs = costs.model_copy(update={"sample_us": 0.0})
    page_draws = all(s.sampled for s in _alone(samples, "short"))

    def alone(c: HostCosts, shape: str) -> dict[str, float]:
        return simulate_load(layout, model, Load(1, (prompt[shape],), reply, requests=1, sampled=page_draws), c)

    def spread(c: HostCosts) -> float:
        return alone(c, "long")["ttft_s"] - alone(c, "short")["ttft_s"]

    def one_tpot(c: HostCosts) -> float:
        return alone(c, "short")["tpot_s"]

    together = max((s.concurrency for s in final), default=1)
    crowd = Load(together, tuple(s.prompt_tokens for s in final) or (1,), reply, requests=together, sampled=page_draws)

    def crowd_tpot(c: HostCosts) -> float:
        return simulate_load(layout, model, crowd, c)["tpot_mean_s"]

    rate_key = "cpu_gflops_per_core" if layout.device == "cpu" else "gpu_efficiency"
    rate_hi = 1.0 if layout.device == "cuda" else base.cpu_gflops_per_core * 50
    for _ in range(PASSES):
        if ttft["long"] > ttft["short"]:
            costs = _fitted(
                costs, rate_key, spread, ttft["long"] - ttft["short"], getattr(base, rate_key) / 50, rate_hi
            )
        if greedy["reply"]:
            step = _step_of(layout, model, greedy["reply"])
            costs = _fitted(costs, "step_ms", step, _gap(greedy["reply"]), 0.01, 500.0)
        else:
            costs = _fitted(costs, "step_ms", one_tpot, tpot, 0.01, 500.0)
        low, high = base.seq_us / SEQ_RANGE, base.seq_us * SEQ_RANGE
        if len(greedy["decode"]) > 1:
            step = _step_of(layout, model, greedy["decode"])
            costs = _fitted(costs, "seq_us", step, _gap(greedy["decode"]), low, high)
        elif len(final) > 1:
            costs = _fitted(costs, "seq_us", crowd_tpot, statistics.median(s.tpot_s or 0.0 for s in final), low, high)
        draw = drawn["decode"] if len(drawn["decode"]) > 1 else drawn["reply"]
        if draw:
            top = max(base.sample_us, base.seq_us) * SAMPLE_RANGE
            costs = _fitted(costs, "sample_us", _step_of(layout, model, draw), _gap(draw), SAMPLE_FLOOR_US, top)
        costs = _fitted_request(costs, lambda c: alone(c, "short")["ttft_s"], ttft["short"])
    fit = {f"{shape}_ttft_ms": round((alone(costs, shape)["ttft_s"] - ttft[shape]) * 1e3, 2) for shape in ttft}
    fit["tpot_ms"] = round((alone(costs, "short")["tpot_s"] - tpot) * 1e3, 3)
    return costs.model_copy(
        update={
            "measured_on": measured_on,
            "measured_at": measured_at,
            "fit": fit,
            "source": f"calibrated on this machine ({measured_on}) from the warm-up of {measured_at}: "
            f"{len(samples)} requests",
        }
    )


def _gap(samples: Sequence[WarmupSample]) -> float:
    """How far apart the tokens of ``samples`` came: their gaps' median."""
    return statistics.median(s.gap_s or 0.0 for s in samples)


def _step_of(layout: Layout, model: ModelSpec, samples: Sequence[WarmupSample]) -> Callable[[HostCosts], float]:
    """The model's step of as many decoding sequences as ``samples`` went together, halfway through their
    replies, drawn as they were, on the host as slowed by that load: what their gaps measured."""
    together = max(s.concurrency for s in samples)
    prompts = tuple(s.prompt_tokens for s in samples)
    tokens = statistics.median_low(s.tokens for s in samples)
    sampled = samples[0].sampled
    load = Load(together, prompts, tokens, requests=together, sampled=sampled)
    context = statistics.mean(prompts) + tokens / 2

    def step(c: HostCosts) -> float:
        host = simulate_load(layout, model, load, c)["host"]
        return decode_step_s(layout, model, c, together, context, host, sampled=sampled)

    return step


def _fitted_request(costs: HostCosts, measure: Callable[[HostCosts], float], target: float) -> HostCosts:
    """``costs`` with the per-request cost and latency (in their proportion) where ``measure`` meets ``target``."""
    share = costs.request_ms / max(costs.request_ms + costs.latency_ms, 1e-9)

    def split(total_ms: float) -> HostCosts:
        return costs.model_copy(update={"request_ms": total_ms * share, "latency_ms": total_ms * (1 - share)})

    return split(_solve(lambda x: measure(split(x)), target, 1e-3, 1e4, rising=True))


def _fitted(
    costs: HostCosts, key: str, measure: Callable[[HostCosts], float], target: float, lo: float, hi: float
) -> HostCosts:
    """``costs`` with ``key`` set where ``measure`` meets ``target`` (in [lo, hi]; ``measure`` moves one
    way with it: tested at both ends)."""
    rising = measure(costs.model_copy(update={key: hi})) >= measure(costs.model_copy(update={key: lo}))
    value = _solve(lambda x: measure(costs.model_copy(update={key: x})), target, lo, hi, rising)
    return costs.model_copy(update={key: value})
