"""The PNGs of bench, tune and bench-startup; each is skipped, with a note, without matplotlib."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.measure.startup_records import StartupFailure, StartupRun

if TYPE_CHECKING:
    from backend.measure.bench import BenchReport
    from backend.measure.tune.records import TuneReport


def _save(path: Path, size: tuple[float, float], draw: Callable[[Any, Any, Any], None]) -> str | None:
    """Two axes side by side, drawn by ``draw(fig, left, right)``, saved to ``path``.

    Returns a note instead when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"matplotlib is not installed: {path.name} skipped (pip install matplotlib)"
    fig, (left, right) = plt.subplots(1, 2, figsize=size)
    try:
        draw(fig, left, right)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return None


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
