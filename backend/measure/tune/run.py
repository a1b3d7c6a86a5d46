"""``tune``: start a few candidate plans on this hardware, measure each, keep the best as a profile.

At most K candidates run (``candidates``: the planner's default first), within a time budget.
Each is a real engine (``Server``, warm-up on) in its own run directory under ``--out`` (so a
running ``serve``'s status file is never touched and no earlier tuned profile leaks in),
measured at the target concurrency and at 1, then stopped; tune.json is rewritten after each.
The best (``selection``) is saved to ``<engine.run_dir>/tuned/<key>.json`` (``config/tuned.py``),
which the next ``serve`` on the same hardware, model and objective applies under the user's pins.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from backend.engine_api import in_words
from backend.errors import UsageError
from backend.measure.bench import client_note
from backend.measure.levels import Load, Target, measure_level
from backend.measure.stats import Level
from backend.measure.tune.budget import Spent, candidate_estimate
from backend.measure.tune.candidates import Candidate, enumerate_candidates, inert, plan_values
from backend.measure.tune.ranking import rank
from backend.measure.tune.records import CandidateRecord, TuneReport
from backend.measure.tune.selection import compare_default, select_best
from backend.prompts import Shape, long_tokens, prompt_room, prompt_shapes
from backend.runtime.processes.process import free_port
from config.calibrated import costs_for
from config.hardware import Hardware
from config.performance.costs import HostCosts
from config.performance.prediction import Load as ExpectedLoad
from config.performance.prediction import Prediction
from config.performance.text import signed, summary
from config.settings import Settings

DEFAULT_MAX_CANDIDATES = 4
DEFAULT_BUDGET_S = 1200.0
DEFAULT_MAX_TOKENS = 64
SINGLE_REQUESTS = 4
"""Requests at concurrency 1 (reported beside the target level; not used to choose)."""
LEVEL_TIME_CAP_S = 90.0
SHORT_PROMPT_TOKENS = 60
"""The short prompt (12 words in a chat template) as the candidates' prediction takes it (bench: 59-61)."""


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


@dataclass
class Measure:
    """How each candidate is loaded."""

    concurrency: int
    requests: int
    max_tokens: int
    prompt_mix: tuple[str, ...] = ("short", "medium", "long")
    time_cap_s: float = LEVEL_TIME_CAP_S
    client_processes: int | None = None
    shapes: dict[str, Shape] | None = None
    """Prompt sizes, measured on the first engine and kept for all (the same load for each)."""


# -- one candidate --------------------------------------------------------------------------
def run_candidate(
    settings: Settings,
    cand: Candidate,
    *,
    port: int,
    run_dir: Path,
    measure: Measure,
    min_model_len: int,
) -> CandidateRecord:
    """Start the candidate's engine, measure it at the target concurrency and at 1, stop it."""
    from backend.runtime.serve import logged_server

    s = settings.model_copy(deep=True)
    s.engine.pins = {**cand.pins, **settings.engine.pins}
    s.engine.port = port
    s.engine.run_dir = run_dir
    s.engine.warmup = True
    run_dir.mkdir(parents=True, exist_ok=True)
    record = CandidateRecord(
        name=cand.name, pins=cand.pins, changes=list(cand.changes), values=cand.values, run_dir=str(run_dir)
    )
    with logged_server(s, run_dir / "serve.log") as server:
        t0 = time.monotonic()
        try:
            if not server.start():
                record.error = (server.status.error or "the engine did not start").splitlines()[0]
                return record
            record.startup_s = round(time.monotonic() - t0, 1)
            record.startup = server.status.startup
            assert server.planned is not None
            plan = server.planned.plan
            actual = plan_values(plan)
            if actual != record.values:
                record.note = f"the engine's plan differs from the enumerated one: {actual}"
                record.values = actual
            target = Target(server.base_url, plan.served_name, s.engine.api_key)
            _measure_levels(record, target, measure, settings.workload.prompt_tokens, min_model_len, plan.device)
            record.ok = True
        except (httpx.HTTPError, ValueError, OSError) as err:  # one bad candidate must not end the tune
            record.error = f"measuring failed: {in_words(err) if isinstance(err, httpx.HTTPError) else err}"
    return record


def _measure_levels(
    record: CandidateRecord, target: Target, measure: Measure, prompt_tokens: int, min_model_len: int, device: str
) -> None:
    """The target level, then concurrency 1, into ``record`` (the prompt sizes measured once per tune)."""
    if measure.shapes is None:
        measure.shapes = asyncio.run(
            prompt_shapes(
                target.base_url,
                target.model,
                measure.prompt_mix,
                api_key=target.api_key,
                max_tokens=measure.max_tokens,
                prompt_tokens=prompt_tokens,
                max_model_len=min_model_len,
                device=device,
            )
        )
    words = tuple(measure.shapes[item].words for item in measure.prompt_mix)
    load = Load(measure.max_tokens, words, True, measure.time_cap_s, processes=measure.client_processes)
    record.target = asyncio.run(measure_level(target, measure.concurrency, measure.requests, load))
    record.single = asyncio.run(measure_level(target, 1, SINGLE_REQUESTS, load))


def _wait_port_free(host: str, port: int, timeout_s: float = 30.0) -> None:
    from backend.runtime.processes.process import port_in_use

    deadline = time.monotonic() + timeout_s
    while port_in_use(host, port) and time.monotonic() < deadline:
        time.sleep(0.5)


def _prediction_error(record: CandidateRecord) -> str:
    """'predicted tokens/s +6 %, TTFT p99 -12 %' (predicted against measured), for a measured candidate."""
    p, m = record.predicted, record.target
    if p is None or m is None or m.ttft_p99_ms is None:
        return "no prediction"
    return (
        f"predicted tokens/s {signed(p.output_tokens_per_s.point, m.output_tokens_per_s)}, "
        f"TTFT p99 {signed(p.ttft_p99_ms.point, m.ttft_p99_ms)}"
    )


def _level_line(label: str, m: Level | None) -> str:
    if not m:
        return f"{label}: -"
    if m.ttft_p50_ms is None or m.ttft_p99_ms is None:
        return f"{label}: {m.errors} errors"
    err = f", {m.errors} errors" if m.errors else ""
    return (
        f"{label}: TTFT p50/p99 {m.ttft_p50_ms:.0f}/{m.ttft_p99_ms:.0f} ms, "
        f"{m.output_tokens_per_s:.0f} tok/s{err}{client_note(m)}"
    )


# -- the run ----------------------------------------------------------------------------------
@dataclass
class TunePlan:
    """What a tune will measure, decided before any engine starts."""

    hardware: Hardware
    model_source: str
    served: str
    concurrency: int
    requests: int
    candidates: list[Candidate]
    refused: list[str]
    chosen: list[Candidate]
    long_prompt_tokens: int
    predicted: dict[str, Prediction]
    """The performance model's figures for every candidate at the target load (they rank them)."""
    costs: HostCosts

    @property
    def device(self) -> str:
        return self.candidates[0].plan.device


def plan_tune(settings: Settings, options: TuneOptions) -> TunePlan:
    """Check the options, enumerate and order the candidates (a dry run reads no weights)."""
    from backend.runtime.resolve import resolve_model
    from config.hardware import resolve_hardware
    from config.pipeline import read_model_shape

    if options.max_candidates < 1:
        raise UsageError(f"--max-candidates {options.max_candidates}: at least 1 (the planner's default)")
    if options.max_tokens < 1 or (options.requests is not None and options.requests < 1):
        raise UsageError("--max-tokens and --requests: at least 1")
    hardware = resolve_hardware(settings.engine.hardware)
    # A dry run needs only the model's shape (no weights fetched), except for the demo.
    dry = options.dry_run and settings.model.id != "demo"
    source = settings.model.id if dry else resolve_model(settings).path
    model, _ = read_model_shape(source, settings.model.revision)
    served = settings.model.served_name or settings.model.id
    workload = settings.workload
    concurrency = options.concurrency or workload.users
    if concurrency < 1:
        raise UsageError(f"--concurrency {concurrency}: at least 1")
    candidates, refused = enumerate_candidates(hardware, model, workload, settings.engine.pins, served)
    device = candidates[0].plan.device
    room = prompt_room(min(c.plan.max_model_len for c in candidates), options.max_tokens)
    long_prompt = max(1, long_tokens(workload.prompt_tokens, device, room))
    requests = options.requests or max(8, 2 * concurrency)
    costs, _ = costs_for(settings.engine.run_dir, hardware.name, device)
    shapes = (SHORT_PROMPT_TOKENS, workload.prompt_tokens, long_prompt)
    load = ExpectedLoad(concurrency, shapes, options.max_tokens, requests, sampled=False)  # measured greedy
    ranked = rank(
        candidates,
        hardware,
        model,
        load,
        costs,
        k=options.max_candidates,
        objective=workload.objective,
        objective_ms=options.objective_ms,
        long_prompt_tokens=long_prompt,
    )
    return TunePlan(
        hardware=hardware,
        model_source=model.source,
        served=served,
        concurrency=concurrency,
        requests=requests,
        candidates=candidates,
        refused=refused,
        chosen=ranked.chosen,
        long_prompt_tokens=long_prompt,
        predicted=ranked.predicted,
        costs=costs,
    )


def print_plan(settings: Settings, options: TuneOptions, tp: TunePlan) -> None:
    o = options
    objective = "none (highest tokens/s)" if o.objective_ms is None else f"p99 TTFT <= {o.objective_ms:g} ms"
    model_id = settings.model.id
    shown = model_id if model_id == tp.model_source else f"{model_id} ({tp.model_source})"
    print(f"tune: {shown} on {tp.hardware.name}; objective '{settings.workload.objective}', {objective}")
    print(
        f"load: {tp.concurrency} concurrent ({tp.requests} requests) and 1 ({SINGLE_REQUESTS}), "
        f"{o.max_tokens} reply tokens; {len(tp.candidates)} valid candidates ranked by prediction, measuring the "
        f"{len(tp.chosen)} best, {len(tp.candidates) - len(tp.chosen)} skipped (budget {o.time_budget_s:.0f} s)"
    )
    print(f"predicted with host costs: {tp.costs.source}")
    for i, c in enumerate(tp.chosen, 1):
        flag = "  (no effect expected at this load)" if inert(c, tp.concurrency, tp.long_prompt_tokens) else ""
        v, p = c.values, tp.predicted[c.name]
        print(f"  {i}. {c.name:30} predicted {summary(p)}")
        print(
            f"     {'':30} TP={v['tensor_parallel_size']} PP={v['pipeline_parallel_size']} "
            f"DP={v['data_parallel_size']} max_num_seqs={v['max_num_seqs']} "
            f"max_num_batched_tokens={v['max_num_batched_tokens']}"
            f"{' async_scheduling' if v['async_scheduling'] else ''} engines_per_gpu={v['engines_per_gpu']} "
            f"{'rust_frontend' if v['rust_frontend'] else 'api_server_count=' + str(v['api_server_count'])} "
            f"stream_interval={v['stream_interval']} "
            f"cudagraph_mode={v['cudagraph_mode']}{flag}"
        )
    for why in tp.refused:
        print(f"  refused by the planner: {why}")


@dataclass
class TuneRun:
    """A tune under way: its plan and where it writes, and what it has measured so far."""

    settings: Settings
    options: TuneOptions
    plan: TunePlan
    out: Path
    port: int
    measure: Measure
    started: datetime
    t0: float
    """time.monotonic() at the start: the clock of the progress lines and duration_s."""
    measured: list[CandidateRecord] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    spent: list[Spent] = field(default_factory=list)

    def say(self, msg: str, end: str = "\n") -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {msg}", end=end, flush=True)

    def report(self, *, partial: bool) -> tuple[TuneReport, CandidateRecord | None]:
        """The report as measured so far ('partial' until the end), and the best."""
        tp, objective_ms = self.plan, self.options.objective_ms
        best, why = select_best(self.measured, objective_ms)
        report = TuneReport(
            started_at=self.started.isoformat(timespec="seconds"),
            finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
            duration_s=round(time.monotonic() - self.t0, 1),
            partial=partial,
            hardware=tp.hardware.name,
            model=self.settings.model.id,
            served_name=tp.served,
            objective=self.settings.workload.objective,
            objective_ms=objective_ms,
            concurrency=tp.concurrency,
            requests=tp.requests,
            max_tokens=self.options.max_tokens,
            prompt_mix=self.measure.shapes,
            user_pins=self.settings.engine.pins,
            candidates_valid=len(tp.candidates),
            chosen=[{"name": c.name, "pins": c.pins, "values": c.values} for c in tp.chosen],
            refused=tp.refused,
            skipped=self.skipped,
            ranked_out=len(tp.candidates) - len(tp.chosen),
            predicted_with=tp.costs.source,
            measured=self.measured,
            best=best.name if best else None,
            why=why,
            default_vs_best=compare_default(self.measured, best, objective_ms),
        )
        return report, best

    def write(self, report: TuneReport) -> Path:
        path = self.out / "tune.json"
        path.write_text(json.dumps(report.model_dump(mode="json"), indent=2))
        return path


def start_run(settings: Settings, options: TuneOptions, tp: TunePlan, started: datetime, t0: float) -> TuneRun:
    out = Path(options.out) if options.out else Path("bench-results") / f"tune-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    host = settings.engine.host if settings.engine.host != "0.0.0.0" else "127.0.0.1"
    measure = Measure(
        concurrency=tp.concurrency,
        requests=tp.requests,
        max_tokens=options.max_tokens,
        client_processes=options.client_processes,
    )
    return TuneRun(settings, options, tp, out, options.engine_port or free_port(host), measure, started, t0)


def measure_candidates(run: TuneRun) -> None:
    """Each chosen candidate in turn while the budget allows; tune.json after each."""
    from config.tuned import slug

    chosen = run.plan.chosen
    min_model_len = min(c.plan.max_model_len for c in chosen)
    for i, cand in enumerate(chosen, 1):
        elapsed = time.monotonic() - run.t0
        engines = cand.plan.total_engines
        if run.spent and elapsed + (estimate := candidate_estimate(run.spent, engines)) > run.options.time_budget_s:
            run.skipped.append(cand.name)
            run.say(
                f"time budget: {elapsed:.0f} s of {run.options.time_budget_s:.0f} s spent, ~{estimate:.0f} s for "
                f"{cand.name} ({engines} engine{'s' if engines > 1 else ''}); skipped"
            )
            continue
        run.say(f"{i}/{len(chosen)} {cand.name:30} ", end="")
        c0 = time.monotonic()
        _wait_port_free(run.settings.engine.host, run.port)
        record = run_candidate(
            run.settings,
            cand,
            port=run.port,
            run_dir=run.out / "engines" / f"{i}-{slug(cand.name)[:40]}",
            measure=run.measure,
            min_model_len=min_model_len,
        )
        record.predicted = run.plan.predicted.get(cand.name)
        record.wall_s = wall = round(time.monotonic() - c0, 1)
        run.spent.append(Spent(wall, record.startup_s, engines))
        run.measured.append(record)
        if record.ok:
            print(
                f"up in {record.startup_s or 0:.0f} s | {_level_line(f'c={run.plan.concurrency}', record.target)} "
                f"| {_level_line('c=1', record.single)} | {record.wall_s:.0f} s | {_prediction_error(record)}",
                flush=True,
            )
        else:
            print(f"failed after {record.wall_s:.0f} s: {record.error}", flush=True)
        run.write(run.report(partial=True)[0])  # a run cut short still leaves what it measured


def finish(run: TuneRun) -> int:
    """Choose, save the tuned profile, write the final tune.json and tune.png; the exit status."""
    from backend.measure.plots import plot_tune
    from config.tuned import TunedProfile, save_tuned

    report, best = run.report(partial=False)
    cmp = report.default_vs_best
    print()
    if best is None:
        print(f"no result: {report.why}")
    else:
        profile = TunedProfile(
            hardware=report.hardware,
            model=report.model,
            objective=report.objective,
            pins=best.pins,
            measured_at=report.started_at,
            objective_ms=report.objective_ms,
            concurrency=report.concurrency,
            winner=best.name,
            measurements=[m.model_dump(mode="json") for m in run.measured],
            default_vs_best=cmp.model_dump(mode="json"),
        )
        path = save_tuned(run.settings.engine.run_dir, profile)
        report.profile = str(path)
        print(f"best: {best.name} ({report.why}); pins {best.pins or '{} (the planner default)'}")
        if cmp.default_measured:
            print(
                f"default vs best: tokens/s x{cmp.tokens_per_s_best_over_default}, p99 TTFT "
                f"x{cmp.p99_ttft_best_over_default} (best / default); default within 5 %: "
                f"{'yes' if cmp.default_within_5pct else 'no'}"
            )
        else:
            print("default vs best: the default did not complete, no comparison")
        print(f"tuned profile: {path} (used by the next `serve` with this hardware, model and objective)")
    json_path = run.write(report)
    note = plot_tune(report, run.out / "tune.png")
    print(f"wrote {json_path}" + (f"; {note}" if note else f" and {run.out / 'tune.png'}"))
    return 0 if best else 1


def run_tune(settings: Settings, options: TuneOptions) -> int:
    """Measure the chosen candidates one engine at a time; save the best as a tuned profile.
    Returns the exit status (0 when a best was found or on a dry run)."""
    t0, started = time.monotonic(), datetime.now(UTC)
    tp = plan_tune(settings, options)
    print_plan(settings, options, tp)
    if options.dry_run:
        return 0
    run = start_run(settings, options, tp, started, t0)
    measure_candidates(run)
    return finish(run)
