"""Read vLLM's Prometheus ``/metrics``: running requests, per-replica counters."""

from __future__ import annotations

import re

import httpx

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        out.setdefault(m.group("name"), []).append((labels, value))
    return out


def root_url(base_url: str) -> str:
    """``http://h:p/v1`` -> ``http://h:p``: /metrics, /health and /tokenize live at the root."""
    return base_url.rstrip("/").removesuffix("/v1")


async def fetch_metrics(client: httpx.AsyncClient, base_url: str) -> Samples:
    r = await client.get(f"{root_url(base_url)}/metrics")
    r.raise_for_status()
    return parse_metrics(r.text)


def total(samples: Samples, name: str) -> float:
    return sum(v for _, v in samples.get(name, []))


def per_engine(samples: Samples, name: str) -> dict[str, float]:
    """Sum of a metric per ``engine`` label (one per data-parallel replica)."""
    out: dict[str, float] = {}
    for labels, value in samples.get(name, []):
        key = labels.get("engine", "0")
        out[key] = out.get(key, 0.0) + value
    return out
