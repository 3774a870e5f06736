"""Throughput charts as inline SVG, drawn on the server: no chart library,
nothing for the browser to run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markupsafe import Markup


def _clock(at: int) -> str:
    # UTC HH:MM by arithmetic: a page draws a few hundred of these per refresh.
    return f"{at % 86400 // 3600:02d}:{at % 3600 // 60:02d}"


def throughput_svg(buckets: Sequence[dict[str, Any]], width: int = 360, height: int = 60) -> Markup:
    """Bars of acked jobs per bucket with dead ones stacked in red; every
    bar has a tooltip with its time and counts. Everything interpolated is
    an int or a float (converted here), so the SVG is built as plain text
    and marked safe once: Markup.format per bar cost most of a page's CPU."""
    width, height = int(width), int(height)
    if not buckets:
        return Markup(f'<svg class="chart" width="{width}" height="{height}" role="img" '
                      f'aria-label="no throughput data"><text x="4" y="{height // 2}" class="muted">'
                      "no settles counted</text></svg>")
    counts = [(int(b["bucket_at"]), int(b["acked"]), int(b["retried"]), int(b["dead"])) for b in buckets]
    peak = max(max(acked + retried + dead for _, acked, retried, dead in counts), 1)
    slot = width / len(counts)
    bar = round(max(slot - 1, 1), 2)
    total = sum(acked for _, acked, _, _ in counts)
    parts = [f'<svg class="chart" width="{width}" height="{height + 12}" viewBox="0 0 {width} {height + 12}" '
             f'role="img" aria-label="{total} acked in the last hour">']
    for i, (at, acked, retried, dead) in enumerate(counts):
        x = round(i * slot, 2)
        y: float = height
        for value, css in ((acked, "ok"), (retried, "warn"), (dead, "bad")):
            if not value:
                continue
            h = max(round(value / peak * height, 2), 1)
            y -= h
            parts.append(f'<rect class="{css}" x="{x}" y="{round(y, 2)}" width="{bar}" height="{h}"/>')
        parts.append(f'<rect class="hit" x="{x}" y="0" width="{round(slot, 2)}" height="{height}"><title>'
                     f"{_clock(at)}: {acked} acked, {retried} retried, {dead} dead</title></rect>")
    parts.append(f'<line class="axis" x1="0" y1="{height}" x2="{width}" y2="{height}"/>')
    parts.append(f'<text x="0" y="{height + 11}" class="muted">{_clock(counts[0][0])}</text>')
    parts.append(f'<text x="{width}" y="{height + 11}" text-anchor="end" class="muted">peak {peak}/min</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
