"""Template helpers of the staff console: durations, JSON, and the inline SVG charts."""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.utils.safestring import SafeString

from seasons import staff_charts

register = template.Library()


@register.filter
def duration(seconds: float | None) -> str:
    """1.25 -> "1.2 s", 95 -> "1.6 min", 7200 -> "2.0 h"; None -> "–"."""
    if seconds is None:
        return "–"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


@register.filter
def pretty_json(value: Any) -> str:
    if value is None or value == "":
        return ""
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False)


@register.filter
def percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


@register.simple_tag
def bars(values: list[float], title: str = "", width: int = 240, height: int = 48, css_id: str = "") -> SafeString:
    return staff_charts.bar_chart(values, title=title, width=width, height=height, css_id=css_id)


@register.simple_tag
def spark(values: list[float], title: str = "", width: int = 160, height: int = 32) -> SafeString:
    return staff_charts.sparkline(values, title=title, width=width, height=height)


@register.simple_tag
def bucket_chart(detail: Any, width: int = 720, height: int = 120) -> SafeString:
    """Players per bucket (the score distribution), hot buckets highlighted."""
    rows = detail.buckets
    return staff_charts.bar_chart(
        [r.count for r in rows], labels=[f"bucket {r.bucket} [{r.low}..{r.high}]" for r in rows],
        highlight={i for i, r in enumerate(rows) if r.hot}, width=width, height=height,
        title="players per score bucket (low scores left)", css_id="bucket-chart",
        axis=(f"score {rows[0].low:,}", f"{rows[-1].high:,}") if rows else None,
    )
