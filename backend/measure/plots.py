"""The PNGs of bench, tune and bench-startup; each is skipped, with a note, without matplotlib."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from backend.measure.startup.records import StartupFailure, StartupRun
from config.compare import PLAN_LABEL

if TYPE_CHECKING:
    from backend.measure.bench import BenchReport
    from backend.measure.tune.records import TuneReport


def _save(path: Path | IO[bytes], size: tuple[float, float], draw: Callable[[Any, Any, Any], None]) -> str | None:
    """Two axes side by side, drawn by ``draw(fig, left, right)``, saved as PNG to ``path`` (a file
    or an open binary stream). A figure of its own, not pyplot's shared state, so that a page may
    draw in a thread. Returns a note instead when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        name = path.name if isinstance(path, Path) else "the plot"
        return f"matplotlib is not installed: {name} skipped (pip install matplotlib)"
    fig = Figure(figsize=size)
    left, right = fig.subplots(1, 2)
    draw(fig, left, right)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    return None


def plot_latency(rows: list[dict[str, Any]], out: IO[bytes]) -> str | None:
    """The page's latency panel: TTFT per reply (its parts stacked where the engine reports them)
    and a histogram of TTFT; for replies of two compared setups, :func:`plot_compared`."""
    if len({setup_of(r) for r in rows}) > 1:
        return plot_compared(rows, out)
    ttft = [(i + 1, r) for i, r in enumerate(rows) if isinstance(r.get("ttft_ms"), (int, float))]

    def draw(fig: Any, ax_t: Any, ax_h: Any) -> None:
        xs = [i for i, _ in ttft]
        split = all(r.get("queue_ms") is not None and r.get("http_ms") is not None for _, r in ttft)
        if split and ttft:
            bottom = [0.0] * len(ttft)
            parts = (("page_ms", "page"), ("http_ms", "HTTP"), ("queue_ms", "queue"), ("prefill_ms", "prefill"))
            for key, label in parts:
                part = [float(r.get(key) or 0.0) for _, r in ttft]
                ax_t.bar(xs, part, bottom=bottom, label=label)
                bottom = [b + p for b, p in zip(bottom, part, strict=True)]
            ax_t.legend(fontsize=8)
        else:
            ax_t.bar(xs, [float(r["ttft_ms"]) for _, r in ttft], color="C0")
        ax_t.set_xlabel("reply")
        ax_t.set_ylabel("TTFT (ms)")
        ax_t.set_title("Time to first token per reply")
        ax_h.hist([float(r["ttft_ms"]) for _, r in ttft], bins=min(20, max(len(ttft), 1)), color="C0")
        ax_h.set_xlabel("TTFT (ms)")
        ax_h.set_ylabel("replies")
        ax_h.set_title("TTFT histogram")
        for ax in (ax_t, ax_h):
            ax.grid(True, axis="y", alpha=0.3)

    return _save(out, (10, 3.6), draw)


def setup_of(row: dict[str, Any]) -> str:
    """The setup a latency row's reply came from; the plan's for rows from before setups were compared."""
    return str(row.get("setup") or PLAN_LABEL)


def plot_compared(rows: list[dict[str, Any]], out: IO[bytes]) -> str | None:
    """Two (or more) setups' replies side by side (``up --compare``): each one's TTFT per message it
    answered, and each one's decode tokens/s, one series per setup in the order they first answered."""
    setups = list(dict.fromkeys(setup_of(r) for r in rows))

    def series(name: str, key: str) -> list[float]:
        mine = [r for r in rows if setup_of(r) == name]
        return [float(r[key]) if isinstance(r.get(key), (int, float)) else float("nan") for r in mine]

    def draw(fig: Any, ax_t: Any, ax_r: Any) -> None:
        for i, name in enumerate(setups):
            for ax, key in ((ax_t, "ttft_ms"), (ax_r, "decode_tok_s")):
                ys = series(name, key)
                ax.plot(range(1, len(ys) + 1), ys, "o-", color=f"C{i}", label=name)
        for ax, title, ylabel in (
            (ax_t, "Time to first token", "TTFT (ms)"),
            (ax_r, "Decode speed", "tokens/s"),
        ):
            ax.set_xlabel("message")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)

    return _save(out, (10, 3.6), draw)


def plot_bench(report: BenchReport, path: Path) -> str | None:
    """bench.png: TTFT p50/p99 and output tokens/s against concurrency, one line per variant."""

    def draw(fig: Any, ax_t: Any, ax_r: Any) -> None:
        variants = sorted({r.variant for r in report.results})
        for i, name in enumerate(variants):
            rows = sorted((r for r in report.results if r.variant == name), key=lambda r: r.concurrency)
            xs = [r.concurrency for r in rows]
            color = f"C{i}"
            ax_t.plot(xs, [r.ttft_p50_ms for r in rows], "o-", color=color, label=f"{name} p50")
            ax_t.plot(xs, [r.ttft_p99_ms for r in rows], "s--", color=color, label=f"{name} p99")
            ax_r.plot(xs, [r.output_tokens_per_s for r in rows], "o-", color=color, label=name)
        for path, shade in (("direct", "black"), ("page", "grey")):
            _predicted(report, path, shade, ax_t, ax_r)
        levels = report.config["levels"]
        for ax, title, ylabel in (
            (ax_t, "Time to first token", "TTFT (ms)"),
            (ax_r, "Output throughput", "output tokens/s"),
        ):
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(c) for c in levels])
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        label = report.label
        fig.suptitle(
            f"{report.engine['model']} on {report.hardware or '?'} — {report.plan.get('summary', '')}"
            + (f" — {label}" if label else ""),
            fontsize=10,
        )

    return _save(path, (12, 4.8), draw)


def _predicted(report: BenchReport, path: str, shade: str, ax_t: Any, ax_r: Any) -> None:
    """The performance model's TTFT p50 and tokens/s for ``path``'s levels: a dotted line in its band."""
    by_level = {r.concurrency: r.expected.predicted for r in report.results if r.path == path and r.expected}
    if not by_level:
        return
    xs = sorted(by_level)
    for ax, key, label in ((ax_t, "ttft_p50_ms", "p50 predicted"), (ax_r, "output_tokens_per_s", "predicted")):
        figs = [getattr(by_level[x], key) for x in xs]
        ax.plot(xs, [f.point for f in figs], "^:", color=shade, label=f"{path} {label}")
        ax.fill_between(xs, [f.low for f in figs], [f.high for f in figs], color=shade, alpha=0.12, linewidth=0)


def plot_tune(report: TuneReport, path: Path) -> str | None:
    """tune.png: tokens/s and p99 TTFT per candidate at the target concurrency; the best in a
    darker color, the objective as a line."""
    rows = [(m.name, m.target) for m in report.measured if m.target]
    if not rows:
        return f"no candidate was measured: {path.name} skipped"

    def draw(fig: Any, ax_r: Any, ax_t: Any) -> None:
        names = [name for name, _ in rows]
        colors = ["C3" if name == report.best else "C0" for name in names]
        ax_r.bar(names, [t.output_tokens_per_s for _, t in rows], color=colors)
        ax_r.set_ylabel("output tokens/s")
        ax_t.bar(names, [t.ttft_p99_ms or 0 for _, t in rows], color=colors)
        ax_t.set_ylabel("p99 TTFT (ms)")
        if report.objective_ms:
            ax_t.axhline(report.objective_ms, color="k", linestyle="--", linewidth=1, label="objective")
            ax_t.legend(fontsize=8)
        for ax, title in ((ax_r, "Throughput"), (ax_t, "p99 time to first token")):
            ax.set_title(f"{title} at {report.concurrency} concurrent")
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle(f"tune: {report.model} on {report.hardware} (best in red: {report.best})", fontsize=10)

    return _save(path, (max(8, 2.2 * len(rows) + 4), 4.8), draw)


def plot_startup(runs: Sequence[StartupRun | StartupFailure], path: Path) -> str | None:
    """startup.png: launch to ready, and the first user's TTFT against the steady one."""
    ok = [r for r in runs if isinstance(r, StartupRun)]
    labels = [f"warm-up {'on' if r.warmup else 'off'}" for r in ok]

    def draw(fig: Any, a: Any, b: Any) -> None:
        a.bar(labels, [r.ready_s for r in ok], color="#888")
        a.set_ylabel("launch to ready (s)")
        x = range(len(ok))
        b.bar([i - 0.2 for i in x], [r.first_user_ttft_s * 1000 for r in ok], 0.4, label="first user request")
        b.bar([i + 0.2 for i in x], [r.steady_ttft_s * 1000 for r in ok], 0.4, label="steady (median of next)")
        b.set_xticks(list(x), labels)
        b.set_ylabel("TTFT (ms)")
        b.legend()

    return _save(path, (9, 3.5), draw)
