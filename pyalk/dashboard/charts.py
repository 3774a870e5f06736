"""Throughput charts as inline SVG, drawn on the server: no chart library,
nothing for the browser to run."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup, escape


def _clock(at: int) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M")


def throughput_svg(buckets: Sequence[dict[str, Any]], width: int = 360, height: int = 60) -> Markup:
    """Bars of acked jobs per bucket with dead ones stacked in red; every
    bar has a tooltip with its time and counts."""
    if not buckets:
        return Markup('<svg class="chart" width="{0}" height="{1}" role="img" aria-label="no throughput data">'
                      '<text x="4" y="{2}" class="muted">no settles counted</text></svg>').format(
            width, height, height // 2)
    peak = max(max(int(b["acked"]) + int(b["retried"]) + int(b["dead"]) for b in buckets), 1)
    slot = width / len(buckets)
    bar = max(slot - 1, 1)
    total = sum(int(b["acked"]) for b in buckets)
    parts = [Markup('<svg class="chart" width="{0}" height="{1}" viewBox="0 0 {0} {1}" role="img" '
                    'aria-label="{2} acked in the last hour">').format(width, height + 12, total)]
    for i, b in enumerate(buckets):
        x = round(i * slot, 2)
        y: float = height
        for kind, css in (("acked", "ok"), ("retried", "warn"), ("dead", "bad")):
            value = int(b[kind])
            if not value:
                continue
            h = max(round(value / peak * height, 2), 1)
            y -= h
            parts.append(Markup('<rect class="{0}" x="{1}" y="{2}" width="{3}" height="{4}"/>').format(
                css, x, round(y, 2), round(bar, 2), h))
        parts.append(Markup('<rect class="hit" x="{0}" y="0" width="{1}" height="{2}"><title>{3}: {4} acked, '
                            '{5} retried, {6} dead</title></rect>').format(
            x, round(slot, 2), height, _clock(int(b["bucket_at"])), b["acked"], b["retried"], b["dead"]))
    parts.append(Markup('<line class="axis" x1="0" y1="{0}" x2="{1}" y2="{0}"/>').format(height, width))
    parts.append(Markup('<text x="0" y="{0}" class="muted">{1}</text>').format(
        height + 11, escape(_clock(int(buckets[0]["bucket_at"])))))
    parts.append(Markup('<text x="{0}" y="{1}" text-anchor="end" class="muted">peak {2}/min</text>').format(
        width, height + 11, peak))
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)
