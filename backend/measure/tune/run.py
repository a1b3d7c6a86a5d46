"""``tune``: start a few candidate plans on this hardware, measure each, keep the best as a profile.

Candidates come from the planner's own rules: every parallel split (TP x PP x replicas) that
uses the GPUs the default uses, crossed with max_num_seqs (the planner's value for that split,
half, double) and max_num_batched_tokens (the planner's, double); ``make_plan`` with those pins
decides which are valid. The planner's default plan is always measured first. At most K run,
within a time budget: changes that cannot matter at the target load (max_num_seqs above the
concurrency either way) go last.

Each candidate is a real engine (``Server``, warm-up on) in its own run directory under
``--out`` (so a running ``serve``'s status file is never touched and no earlier tuned profile
leaks in), measured at the target concurrency and at 1, then stopped. The best: highest
tokens/s among candidates whose p99 TTFT meets ``--objective-ms``; when none does, the lowest
p99 TTFT. It is saved to ``<engine.run_dir>/tuned/<key>.json`` (``config/tuned.py``), which
the next ``serve`` on the same hardware, model and objective applies under the user's pins.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from backend.errors import UsageError
from backend.measure.bench import client_note, measure_level, prompt_shapes
from backend.measure.prompts import LONG_CAP
from backend.runtime.process import free_port
from config.hardware import Hardware
from config.model import ModelSpec
from config.plan import Plan
from config.planner import PlanError, coerce_pins, make_plan
from config.settings import Settings, WorkloadSettings

TUNED_KEYS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "async_scheduling",
)
SPLIT_KEYS = TUNED_KEYS[:3]
DEFAULT_MAX_CANDIDATES = 4
DEFAULT_BUDGET_S = 1200.0
DEFAULT_MAX_TOKENS = 64
SINGLE_REQUESTS = 4
"""Requests at concurrency 1 (reported beside the target level; not used to choose)."""
LEVEL_TIME_CAP_S = 90.0
PRIOR_CANDIDATE_S = {"cpu": 180.0, "cuda": 200.0}
"""Start + warm-up + measuring one candidate, before any has been timed on this machine."""
WITHIN = 0.05
"""The default counts as as good as the best when within 5 %."""
# Which single change to try first, per objective (after other parallel splits).
CHANGE_ORDER = {
    "throughput": ("split", "seqs x2", "batch x2", "async", "seqs /2"),
    "balanced": ("split", "seqs x2", "seqs /2", "batch x2", "async"),
    "latency": ("split", "seqs /2", "batch x2", "async", "seqs x2"),
}


# -- candidates -----------------------------------------------------------------------------
@dataclass
class Candidate:
    """One plan to measure: the pins that make it (beyond the user's own) and the plan they give."""

    name: str
    pins: dict[str, Any]
    """Values that differ from the planner's default; the user's own pins are added at start."""
    plan: Plan
    changes: tuple[str, ...] = ()
    """What differs from the default: 'split', 'seqs /2', 'seqs x2', 'batch x2', 'async'."""
    base: dict[str, int] = field(default_factory=dict)
    """The planner's own values for this candidate's split (what 'x2' and '/2' are of)."""

    @property
    def values(self) -> dict[str, Any]:
        return plan_values(self.plan)


def plan_values(plan: Plan) -> dict[str, Any]:
    return {k: getattr(plan, k) for k in (*TUNED_KEYS, "max_model_len")}


def _split_name(tp: int, pp: int, dp: int) -> str:
    return f"TP{tp} PP{pp} DP{dp}"


def parallel_splits(hardware: Hardware, default: Plan) -> list[tuple[int, int, int]]:
    """(TP, PP, replicas) using the GPUs the default plan uses; the default's split first."""
    first = (default.tensor_parallel_size, default.pipeline_parallel_size, default.data_parallel_size)
    if not hardware.has_gpu:
        return [first]
    gpus = len(default.gpus) or hardware.gpus_per_node
    if hardware.nodes > 1:  # one engine spans the nodes: no replicas
        total = gpus * hardware.nodes
        found = [(tp, total // tp, 1) for tp in range(1, gpus + 1) if total % tp == 0]
    else:
        divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
        found = [(t, p, d) for t, p, d in itertools.product(divisors, repeat=3) if t * p * d == gpus]
    return [first] + [s for s in found if s != first]


def enumerate_candidates(
    hardware: Hardware,
    model: ModelSpec,
    workload: WorkloadSettings,
    user_pins: dict[str, Any] | None = None,
    served_name: str | None = None,
) -> tuple[list[Candidate], list[str]]:
    """Every distinct plan the planner accepts, the default first; and why the others were refused.

    Raises PlanError when the user's own pins give no plan (nothing to tune then).
    """
    user = coerce_pins(dict(user_pins or {}))  # '--set' gives strings; compare typed values

    def plan(pins: dict[str, Any]) -> Plan:
        return make_plan(hardware, model, workload, {**pins, **user}, served_name=served_name)

    default = plan({})
    first_split = (default.tensor_parallel_size, default.pipeline_parallel_size, default.data_parallel_size)
    candidates: list[Candidate] = []
    rejected: list[str] = []
    seen: set[tuple[Any, ...]] = set()

    def overruled(pins: dict[str, Any]) -> bool:
        """A value the user pinned otherwise: the user's pin would win, so it is no candidate."""
        return any(key in user and user[key] != value for key, value in pins.items())

    def add(name: str, pins: dict[str, Any], changes: tuple[str, ...], base: dict[str, int]) -> None:
        if overruled(pins):
            return
        try:
            p = plan(pins)
        except PlanError as err:
            rejected.append(f"{name}: {err}")
            return
        key = tuple(plan_values(p).values())
        if key in seen:
            return
        seen.add(key)
        candidates.append(Candidate(name=name, pins=pins, plan=p, changes=changes, base=base))

    for split in parallel_splits(hardware, default):
        split_pins = {} if split == first_split else dict(zip(SPLIT_KEYS, split, strict=True))
        if overruled(split_pins):
            continue
        try:
            base_plan = default if not split_pins else plan(split_pins)
        except PlanError as err:
            rejected.append(f"{_split_name(*split)}: {err}")
            continue
        seqs, batch = base_plan.max_num_seqs, base_plan.max_num_batched_tokens
        base = {"max_num_seqs": seqs, "max_num_batched_tokens": batch}
        # async scheduling: GPU only (the planner leaves it off and says `tune` measures it).
        asyncs = (base_plan.async_scheduling, True) if default.device == "cuda" else (base_plan.async_scheduling,)
        variants = itertools.product((seqs, max(1, seqs // 2), seqs * 2), (batch, batch * 2), asyncs)
        for seqs_v, batch_v, async_v in variants:
            pins = dict(split_pins)
            changes: list[str] = ["split"] if split_pins else []
            parts = [_split_name(*split)] if split_pins else []
            if seqs_v != seqs:
                pins["max_num_seqs"] = seqs_v
                changes.append("seqs x2" if seqs_v > seqs else "seqs /2")
                parts.append(f"seqs {seqs_v}")
            if batch_v != batch:
                pins["max_num_batched_tokens"] = batch_v
                changes.append("batch x2")
                parts.append(f"batch {batch_v}")
            if async_v != base_plan.async_scheduling:
                pins["async_scheduling"] = async_v
                changes.append("async")
                parts.append("async scheduling")
            add(" + ".join(parts) or "default", pins, tuple(changes), base)
    return candidates, rejected


def inert_changes(candidate: Candidate, concurrency: int, long_prompt_tokens: int) -> list[str]:
    """The candidate's changes that cannot show at this load.

    max_num_seqs only limits when a replica has more requests than it; max_num_batched_tokens
    only when one step's prompt tokens (requests x longest prompt) exceed it. With replicas,
    one may get all the requests (vLLM's balancer is uneven: on 2 x H200 at 32 concurrent, 16
    per replica queued), so each is assumed to see the whole load.
    """
    per_replica = concurrency  # not concurrency / replicas: see above
    seqs_base = candidate.base.get("max_num_seqs", candidate.plan.max_num_seqs)
    batch_base = candidate.base.get("max_num_batched_tokens", candidate.plan.max_num_batched_tokens)
    idle: list[str] = []
    for change in candidate.changes:
        if change.startswith("seqs") and min(seqs_base, candidate.plan.max_num_seqs) >= per_replica:
            idle.append(change)
        if change.startswith("batch") and min(per_replica, seqs_base) * long_prompt_tokens <= batch_base:
            idle.append(change)
    return idle


def inert(candidate: Candidate, concurrency: int, long_prompt_tokens: int) -> bool:
    """True when the candidate differs from the default, but in nothing that can show at this load."""
    idle = inert_changes(candidate, concurrency, long_prompt_tokens)
    return bool(candidate.changes) and len(idle) == len(candidate.changes)


def order_candidates(
    candidates: Sequence[Candidate],
    k: int,
    objective: str,
    concurrency: int,
    long_prompt_tokens: int,
) -> list[Candidate]:
    """The default, then up to k−1 others: changes that can show at this load first, single
    changes before combinations, in the objective's order (other splits first). Halving
    max_num_seqs below the target load goes near the end unless the objective is latency:
    on one H200 it cost 30 % of tokens/s and doubled p99 TTFT at 32 concurrent."""
    if not candidates:
        return []
    order = CHANGE_ORDER.get(objective, CHANGE_ORDER["balanced"])
    throughput_first = objective != "latency"

    def key(c: Candidate) -> tuple[Any, ...]:
        idle = len(inert_changes(c, concurrency, long_prompt_tokens))
        # Fewer sequences than the target load (a replica may get all of it) only queues
        # requests: last but one, unless for latency.
        queues = throughput_first and "seqs /2" in c.changes and c.plan.max_num_seqs < concurrency
        ranks = tuple(sorted(order.index(ch) for ch in c.changes))
        p = c.plan
        # Replicas before TP before PP for throughput (measured on H200); widest TP for latency.
        split = (
            (-p.data_parallel_size, p.pipeline_parallel_size, p.tensor_parallel_size)
            if throughput_first
            else (-p.tensor_parallel_size, p.pipeline_parallel_size, -p.data_parallel_size)
        )
        return (idle == len(c.changes), queues, idle, len(c.changes), ranks, split)

    default, rest = candidates[0], list(candidates[1:])
    return [default, *sorted(rest, key=key)[: max(0, k - 1)]]


# -- choosing ---------------------------------------------------------------------------------
def usable(m: dict[str, Any]) -> bool:
    """Started, and every request at the target concurrency succeeded."""
    t = m.get("target") or {}
    return bool(m.get("ok")) and t.get("errors", 1) == 0 and t.get("ok", 0) > 0 and t.get("ttft_p99_ms") is not None


def _tps(m: dict[str, Any]) -> float:
    return float(m["target"]["output_tokens_per_s"])


def _p99(m: dict[str, Any]) -> float:
    return float(m["target"]["ttft_p99_ms"])


def select_best(measured: Sequence[dict[str, Any]], objective_ms: float | None) -> tuple[dict[str, Any] | None, str]:
    """Highest tokens/s among those meeting the p99 TTFT objective; none meets it: lowest p99.

    Ties go to the earlier candidate (the default is first). Returns (best or None, why).
    """
    ok = [m for m in measured if usable(m)]
    if not ok:
        return None, "no candidate started and served every request"
    meeting = ok if objective_ms is None else [m for m in ok if _p99(m) <= objective_ms]
    if meeting:
        best = max(meeting, key=_tps)  # max keeps the first of equals
        bound = "no p99 TTFT objective" if objective_ms is None else f"p99 TTFT <= {objective_ms:g} ms"
        return best, f"highest tokens/s among {len(meeting)} of {len(ok)} candidates meeting {bound}"
    best = min(ok, key=_p99)
    return best, f"no candidate met p99 TTFT <= {objective_ms:g} ms; lowest p99 TTFT"


def compare_default(
    measured: Sequence[dict[str, Any]], best: dict[str, Any] | None, objective_ms: float | None
) -> dict[str, Any]:
    """The planner's default against the best: ratios, and whether the default is within 5 %."""
    default = next((m for m in measured if m.get("name") == "default"), None)
    if default is None or best is None or not usable(default):
        return {"default_measured": bool(default and usable(default)), "default_within_5pct": False}
    any_met = objective_ms is None or _p99(best) <= objective_ms
    if any_met:
        default_meets = objective_ms is None or _p99(default) <= objective_ms
        within = default_meets and _tps(default) >= (1 - WITHIN) * _tps(best)
    else:
        within = _p99(default) <= (1 + WITHIN) * _p99(best)
    return {
        "default_measured": True,
        "best": best["name"],
        "tokens_per_s_best_over_default": round(_tps(best) / _tps(default), 3) if _tps(default) else None,
        "p99_ttft_best_over_default": round(_p99(best) / _p99(default), 3) if _p99(default) else None,
        "default_within_5pct": bool(within),
    }


# -- running ------------------------------------------------------------------------------------
def candidate_estimate(spent: Sequence[float], device: str) -> float:
    """Seconds the next candidate will take: the mean so far, else a prior for the device.

    The default always runs; another starts only when elapsed + this fits the budget.
    """
    return sum(spent) / len(spent) if spent else PRIOR_CANDIDATE_S.get(device, PRIOR_CANDIDATE_S["cuda"])


def _wait_port_free(host: str, port: int, timeout_s: float = 30.0) -> None:
    from backend.runtime.process import port_in_use

    deadline = time.monotonic() + timeout_s
    while port_in_use(host, port) and time.monotonic() < deadline:
        time.sleep(0.5)


def _level_line(label: str, m: dict[str, Any] | None) -> str:
    if not m:
        return f"{label}: -"
    if m.get("ttft_p50_ms") is None:
        return f"{label}: {m.get('errors', 0)} errors"
    err = f", {m['errors']} errors" if m.get("errors") else ""
    return (
        f"{label}: TTFT p50/p99 {m['ttft_p50_ms']:.0f}/{m['ttft_p99_ms']:.0f} ms, "
        f"{m['output_tokens_per_s']:.0f} tok/s{err}{client_note(m)}"
    )


@dataclass
class Measure:
    """How each candidate is loaded."""

    concurrency: int
    requests: int
    max_tokens: int
    prompt_mix: tuple[str, ...] = ("short", "medium", "long")
    time_cap_s: float = LEVEL_TIME_CAP_S
    client_processes: int | None = None
    shapes: dict[str, dict[str, int]] | None = None
    """Prompt sizes, measured on the first engine and kept for all (the same load for each)."""


def run_candidate(
    settings: Settings,
    cand: Candidate,
    *,
    port: int,
    run_dir: Path,
    measure: Measure,
    min_model_len: int,
) -> dict[str, Any]:
    """Start the candidate's engine, measure it at the target concurrency and at 1, stop it."""
    from backend.runtime.serve import logged_server

    s = settings.model_copy(deep=True)
    s.engine.pins = {**cand.pins, **settings.engine.pins}
    s.engine.port = port
    s.engine.run_dir = run_dir
    s.engine.warmup = True
    run_dir.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "name": cand.name,
        "pins": cand.pins,
        "changes": list(cand.changes),
        "values": cand.values,
        "run_dir": str(run_dir),
        "ok": False,
        "error": None,
    }
    with logged_server(s, run_dir / "serve.log") as server:
        t0 = time.monotonic()
        try:
            if not server.start():
                record["error"] = (server.status.error or "the engine did not start").splitlines()[0]
                return record
            record["startup_s"] = round(time.monotonic() - t0, 1)
            record["startup"] = server.status.startup
            assert server.planned is not None
            actual = plan_values(server.planned.plan)
            if actual != record["values"]:
                record["note"] = f"the engine's plan differs from the enumerated one: {actual}"
                record["values"] = actual
            model = server.planned.plan.served_name
            api_key = s.engine.api_key
            if measure.shapes is None:
                measure.shapes = asyncio.run(
                    prompt_shapes(
                        server.base_url,
                        model,
                        measure.prompt_mix,
                        api_key=api_key,
                        max_tokens=measure.max_tokens,
                        prompt_tokens=settings.workload.prompt_tokens,
                        max_model_len=min_model_len,
                        device=server.planned.plan.device,
                    )
                )
            words = [measure.shapes[item]["words"] for item in measure.prompt_mix]
            for key, conc, n in (
                ("target", measure.concurrency, measure.requests),
                ("single", 1, SINGLE_REQUESTS),
            ):
                record[key] = asyncio.run(
                    measure_level(
                        server.base_url,
                        model,
                        conc,
                        n,
                        max_tokens=measure.max_tokens,
                        prompt_words=words,
                        api_key=api_key,
                        keepalive=True,
                        time_cap_s=measure.time_cap_s,
                        processes=measure.client_processes,
                    )
                )
            record["ok"] = True
        except (httpx.HTTPError, ValueError, OSError) as err:  # one bad candidate must not end the tune
            record["error"] = f"measuring failed: {type(err).__name__}: {err}"
    return record


@dataclass(frozen=True)
class TuneOptions:
    """What a tune run measures and within which bounds (the ``tune`` command's flags)."""

    objective_ms: float | None = None
    concurrency: int | None = None
    requests: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    client_processes: int | None = None
    max_candidates: int = DEFAULT_MAX_CANDIDATES
    time_budget_s: float = DEFAULT_BUDGET_S
    engine_port: int | None = None
    out: str | None = None
    dry_run: bool = False


def run_tune(settings: Settings, args: TuneOptions) -> int:
    """Measure the chosen candidates one engine at a time; save the best as a tuned profile.
    Returns the exit status (0 when a best was found or on a dry run)."""
    from backend.runtime.resolve import resolve_model
    from config.hardware import resolve_hardware
    from config.pipeline import read_model_shape
    from config.tuned import TunedProfile, save_tuned, slug

    t0 = time.monotonic()
    started = datetime.now(UTC)

    def say(msg: str, end: str = "\n") -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", end=end, flush=True)

    if args.max_candidates < 1:
        raise UsageError(f"--max-candidates {args.max_candidates}: at least 1 (the planner's default)")
    if args.max_tokens < 1 or (args.requests is not None and args.requests < 1):
        raise UsageError("--max-tokens and --requests: at least 1")
    hardware = resolve_hardware(settings.engine.hardware)
    # A dry run needs only the model's shape (no weights fetched), except for the demo.
    dry = args.dry_run and settings.model.id != "demo"
    source = settings.model.id if dry else resolve_model(settings).path
    model, _ = read_model_shape(source, settings.model.revision)
    served = settings.model.served_name or settings.model.id
    workload = settings.workload
    concurrency = args.concurrency or workload.users
    if concurrency < 1:
        raise UsageError(f"--concurrency {concurrency}: at least 1")
    requests = args.requests or max(8, 2 * concurrency)
    candidates, rejected = enumerate_candidates(hardware, model, workload, settings.engine.pins, served)
    device = candidates[0].plan.device
    room = min(c.plan.max_model_len for c in candidates) - args.max_tokens - 64
    long_tokens = max(1, min(4 * workload.prompt_tokens, LONG_CAP[device], room))
    chosen = order_candidates(candidates, args.max_candidates, workload.objective, concurrency, long_tokens)
    objective = "none (highest tokens/s)" if args.objective_ms is None else f"p99 TTFT <= {args.objective_ms:g} ms"
    shown = settings.model.id if settings.model.id == model.source else f"{settings.model.id} ({model.source})"
    print(f"tune: {shown} on {hardware.name}; objective '{workload.objective}', {objective}")
    print(
        f"load: {concurrency} concurrent ({requests} requests) and 1 ({SINGLE_REQUESTS}), "
        f"{args.max_tokens} reply tokens; {len(candidates)} valid candidates, measuring {len(chosen)} "
        f"(budget {args.time_budget_s:.0f} s)"
    )
    for i, c in enumerate(chosen, 1):
        flag = "  (no effect expected at this load)" if inert(c, concurrency, long_tokens) else ""
        v = c.values
        print(
            f"  {i}. {c.name:30} TP={v['tensor_parallel_size']} PP={v['pipeline_parallel_size']} "
            f"DP={v['data_parallel_size']} max_num_seqs={v['max_num_seqs']} "
            f"max_num_batched_tokens={v['max_num_batched_tokens']}"
            f"{' async_scheduling' if v['async_scheduling'] else ''}{flag}"
        )
    for why in rejected:
        print(f"  refused by the planner: {why}")
    if args.dry_run:
        return 0

    out = Path(args.out) if args.out else Path("bench-results") / f"tune-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    port = args.engine_port or free_port(settings.engine.host if settings.engine.host != "0.0.0.0" else "127.0.0.1")
    measure = Measure(
        concurrency=concurrency, requests=requests, max_tokens=args.max_tokens, client_processes=args.client_processes
    )
    measured: list[dict[str, Any]] = []
    skipped: list[str] = []
    spent: list[float] = []

    def write_report(partial: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """tune.json as measured so far ('partial': true until the end); the report and the best."""
        best, why = select_best(measured, args.objective_ms)
        report: dict[str, Any] = {
            "started_at": started.isoformat(timespec="seconds"),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - t0, 1),
            "partial": partial,
            "hardware": hardware.name,
            "model": settings.model.id,
            "served_name": served,
            "objective": workload.objective,
            "objective_ms": args.objective_ms,
            "concurrency": concurrency,
            "requests": requests,
            "max_tokens": args.max_tokens,
            "prompt_mix": measure.shapes,
            "user_pins": settings.engine.pins,
            "candidates_valid": len(candidates),
            "chosen": [{"name": c.name, "pins": c.pins, "values": c.values} for c in chosen],
            "refused": rejected,
            "skipped": skipped,
            "measured": measured,
            "best": best["name"] if best else None,
            "why": why,
            "default_vs_best": compare_default(measured, best, args.objective_ms),
        }
        (out / "tune.json").write_text(json.dumps(report, indent=2))
        return report, best

    for i, cand in enumerate(chosen, 1):
        elapsed = time.monotonic() - t0
        estimate = candidate_estimate(spent, device)
        if i > 1 and elapsed + estimate > args.time_budget_s:
            skipped = [c.name for c in chosen[i - 1 :]]
            say(f"time budget: {elapsed:.0f} s spent, ~{estimate:.0f} s per candidate; skipped {', '.join(skipped)}")
            break
        say(f"{i}/{len(chosen)} {cand.name:30} ", end="")
        c0 = time.monotonic()
        _wait_port_free(settings.engine.host, port)
        record = run_candidate(
            settings,
            cand,
            port=port,
            run_dir=out / "engines" / f"{i}-{slug(cand.name)[:40]}",
            measure=measure,
            min_model_len=min(c.plan.max_model_len for c in chosen),
        )
        record["wall_s"] = round(time.monotonic() - c0, 1)
        spent.append(record["wall_s"])
        measured.append(record)
        if record["ok"]:
            print(
                f"up in {record['startup_s']:.0f} s | {_level_line(f'c={concurrency}', record.get('target'))} "
                f"| {_level_line('c=1', record.get('single'))} | {record['wall_s']:.0f} s",
                flush=True,
            )
        else:
            print(f"failed after {record['wall_s']:.0f} s: {record['error']}", flush=True)
        if i < len(chosen):
            write_report(partial=True)  # a run cut short still leaves what it measured

    report, best = write_report(partial=False)
    why, cmp = report["why"], report["default_vs_best"]
    print()
    if best is None:
        print(f"no result: {why}")
    else:
        profile = TunedProfile(
            hardware=hardware.name,
            model=settings.model.id,
            objective=workload.objective,
            pins=best["pins"],
            measured_at=started.isoformat(timespec="seconds"),
            objective_ms=args.objective_ms,
            concurrency=concurrency,
            winner=best["name"],
            measurements=measured,
            default_vs_best=cmp,
        )
        path = save_tuned(settings.engine.run_dir, profile)
        report["profile"] = str(path)
        print(f"best: {best['name']} ({why}); pins {best['pins'] or '{} (the planner default)'}")
        if cmp.get("default_measured"):
            print(
                f"default vs best: tokens/s x{cmp['tokens_per_s_best_over_default']}, p99 TTFT "
                f"x{cmp['p99_ttft_best_over_default']} (best / default); default within 5 %: "
                f"{'yes' if cmp['default_within_5pct'] else 'no'}"
            )
        else:
            print("default vs best: the default did not complete, no comparison")
        print(f"tuned profile: {path} (used by the next `serve` with this hardware, model and objective)")
    (out / "tune.json").write_text(json.dumps(report, indent=2))  # now with the profile's path
    note = plot_tune(report, out / "tune.png")
    print(f"wrote {out / 'tune.json'}" + (f"; {note}" if note else f" and {out / 'tune.png'}"))
    return 0 if best else 1


def plot_tune(report: dict[str, Any], path: Path) -> str | None:
    """tune.png: tokens/s and p99 TTFT per candidate at the target concurrency; the best in a
    darker color, the objective as a line. Returns a note instead when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: tune.png skipped"
    rows = [m for m in report["measured"] if m.get("target")]
    if not rows:
        return "no candidate was measured: tune.png skipped"
    names = [m["name"] for m in rows]
    colors = ["C3" if m["name"] == report.get("best") else "C0" for m in rows]
    fig, (ax_r, ax_t) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(rows) + 4), 4.8))
    ax_r.bar(names, [m["target"]["output_tokens_per_s"] for m in rows], color=colors)
    ax_r.set_ylabel("output tokens/s")
    ax_t.bar(names, [m["target"]["ttft_p99_ms"] or 0 for m in rows], color=colors)
    ax_t.set_ylabel("p99 TTFT (ms)")
    if report.get("objective_ms"):
        ax_t.axhline(report["objective_ms"], color="k", linestyle="--", linewidth=1, label="objective")
        ax_t.legend(fontsize=8)
    for ax, title in ((ax_r, "Throughput"), (ax_t, "p99 time to first token")):
        ax.set_title(f"{title} at {report['concurrency']} concurrent")
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"tune: {report['model']} on {report['hardware']} (best in red: {report.get('best')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
