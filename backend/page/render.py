"""What the page shows that is not the reply itself: footers, progress, and the live plan in
``chainlit.md`` (the tracked file is a template; its marker is replaced by the plan)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from backend.engine_api import ChatResult
from backend.runtime.rundir import RunDir
from backend.runtime.status import EngineStatus
from config.performance.text import markdown

MARKDOWN_MARKS = str.maketrans({c: f"\\{c}" for c in "\\`*_[]()<>!|~#&:$@.{}"})
"""Backslash-escaped by :func:`as_plain`: what makes Markdown out of text in Chainlit's renderer (links,
images, emphasis, code, HTML, tables; ``:name`` directives; autolinked addresses)."""
PAGE_MARKER = "<!-- engine-plan -->"
"""Where the live plan goes in the tracked ``chainlit.md`` template."""


def as_plain(text: str) -> str:
    """``text`` that a person sent, to be shown inside a Markdown message as the characters it is: no
    link, image, emphasis, code or HTML made of it."""
    return text.translate(MARKDOWN_MARKS)


def progress_line(status: EngineStatus) -> str:
    return f"Engine **{status.state}**: {status.detail or '…'} — {status.progress:.0%}"


def footer(result: ChatResult, *, stopped: bool = False, split: str = "") -> str:
    """``TTFT 23 ms (engine 21 ms) · 48 tokens · 35.2 tok/s``: the first token as the user
    waited for it (from the message reaching the page), and the engine's share of that; then
    ``split``, its parts and the time of day (``latency.split_line``)."""
    if result.ttft_s is None:
        ttft = "no first token"
    else:
        engine = result.engine_ttft_s or 0.0
        ttft = f"TTFT {result.ttft_s * 1000:.0f} ms (engine {engine * 1000:.0f} ms)"
    line = f"{ttft} · {result.tokens} tokens · {result.tokens_per_s:.1f} tok/s" + (f" · {split}" if split else "")
    return f"stopped · {line}" if stopped else line


def with_footer(text: str, line: str, note: str = "") -> str:
    """The reply, then the footer in small print; an unclosed code fence is closed first."""
    if text.count("```") % 2:
        text += "\n```"
    extra = f"  \n*{note}*" if note else ""
    return f"{text}\n\n---\n*{line}*{extra}"


def plan_markdown(status: EngineStatus | None, run_dir: RunDir) -> str:
    """What runs and why, from the status file and ``plan.json``: the page's live section."""
    if status is None:
        return "_No engine has been started from this run directory yet._"
    plan = run_dir.plan()
    detail = f" — {status.detail} ({status.progress:.0%})" if status.state != "ready" and status.detail else ""
    lines = [f"**Engine:** {status.state}{detail}  "]
    lines += [f"> {note}  " for note in status.notes]
    if status.plan_summary:
        lines.append(f"**Plan:** {status.plan_summary}  ")
    if status.compared:
        beside = RunDir(status.compared.run_dir).status()
        what = f"{beside.plan_summary} ({beside.state})" if beside else "not started yet"
        lines.append(f"**Compared beside it:** {status.compared.label}: {what}  ")
    if status.hardware:
        lines.append(f"**Hardware:** {status.hardware}  ")
    if status.model:
        lines.append(f"**Model:** {status.model}, served as `{status.served_name}`  ")
    w = status.warmup
    if w is not None and not w.disabled:
        lines.append(
            f"**Warm-up:** first token {w.first_ttft_s * 1000:.0f} ms on the first request, "
            f"{w.steady_ttft_s * 1000:.0f} ms once warm  "
        )
    if status.expected is not None:
        lines += markdown(status.expected)
    if status.demo:
        lines += ["", "> ⚠️ **Demo model: random weights.** Answers are noise; serve real weights with `--model`."]
    if status.plan_reasons:
        lines += ["", "| Setting | Value | Why |", "|---|---|---|"]
        for key, why in status.plan_reasons.items():
            value = getattr(plan, key, "")
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items())
            lines.append(f"| `{key}` | {str(value).replace('|', '/')} | {why.replace('|', '/')} |")
    lines += ["", f"_Updated {time.strftime('%H:%M:%S', time.localtime(status.updated_at))}._"]
    return "\n".join(lines)


def render_page(template: str, status: EngineStatus | None, run_dir: RunDir) -> str:
    """The tracked ``chainlit.md`` with its plan marker replaced by :func:`plan_markdown`."""
    section = plan_markdown(status, run_dir)
    if PAGE_MARKER in template:
        return template.replace(PAGE_MARKER, section)
    return f"{template.rstrip()}\n\n{section}\n"


def write_if_changed(path: Path, text: str) -> bool:
    """Atomic replace, only when the text differs (readers see whole files)."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")  # pages sharing a run dir write in turn
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True
