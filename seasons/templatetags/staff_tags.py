"""Template helpers of the staff console: numbers, durations, JSON, and the inline SVG charts.

One number format everywhere in the console: quantities (counts, scores, rates) go through
`num` (thousands separators: 6,003); identifiers (versions, ids, watermarks) are printed as
they are (version 6003).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from leaderboard.core.humanize import instant_text
from seasons import staff_charts

register = template.Library()


@register.filter
def num(value: float | int | str | None, decimals: int = 0) -> str:
    """6003 -> "6,003"; 1234.56|num:1 -> "1,234.6"; None or "" -> "–"."""
    if value is None or value == "":
        return "–"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not decimals:
        return staff_charts.quantity(round(number))
    return f"{number:,.{int(decimals)}f}"


def _seconds(value: float) -> str:
    if 0 < value < 1:
        return f"{value * 1000:,.0f} ms"
    if value < 10:
        return f"{value:.1f} s"
    return f"{value:,.0f} s" if value < 120 else duration(value)


def _per_second(value: float) -> str:
    return f"{value:,.1f}/s" if value < 100 else f"{value:,.0f}/s"


def _milliseconds(value: float) -> str:
    return f"{value:,.1f} ms" if value < 10 else f"{value:,.0f} ms"


_UNITS = {"s": _seconds, "/s": _per_second, "ms": _milliseconds}


@register.simple_tag
def time_series(series: Any, unit: str, title: str, window: int, window_label: str, css_id: str = "") -> SafeString:
    """A chart of one of the overview's sample series (seasons/staff/console/selectors.Series)."""
    return staff_charts.time_chart(series.points, span=float(window), fmt=_UNITS[unit], title=title,
                                   span_label=window_label, css_id=css_id)


@register.simple_tag
def rank_history_chart(places: Any, days: int) -> SafeString:
    """A player's rank at each midnight (leaderboard.history.selectors.SnapshotPlace), over
    the last `days` days; a day they were not ranked breaks the line."""
    if not places:
        return staff_charts.time_chart([], span=1.0, fmt=_rank, title="rank at 00:00 UTC", span_label=f"{days} d")
    end = places[-1].taken_for
    start = end.timestamp() - (days - 1) * 86_400
    by_day = {p.taken_for.timestamp(): p.rank for p in places}
    points = [(t - start, by_day.get(t)) for t in (start + d * 86_400 for d in range(days))]
    return staff_charts.time_chart(points, span=max(1.0, (days - 1) * 86_400.0), fmt=_rank,
                                   title="rank at 00:00 UTC (lower is better)", span_label=f"{days - 1} d",
                                   css_id="player-history-chart")


def _rank(value: float) -> str:
    return f"{value:,.0f}"


@register.simple_tag
def series_latest(series: Any, unit: str) -> str:
    """The newest value of a sample series in its chart's unit; "–" when there is none."""
    return "–" if series.latest is None else _UNITS[unit](series.latest)


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
def when(value: datetime | None, precision: str = "") -> str:
    """An instant for people: "2026-12-03 19:30 UTC (in 4 minutes)"; `when:"s"` to the second."""
    return "–" if value is None else instant_text(value, seconds=precision == "s")


@register.filter
def pretty_json(value: Any) -> str:
    if value is None or value == "":
        return ""
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False)


# An audit value longer than this is summarised, the whole of it behind "show all".
SUMMARY_LIST_ITEMS = 6
SUMMARY_TEXT_CHARS = 64  # a content hash (64 hex digits) whole
SUMMARY_LINES = 12


def _summarised(value: Any) -> Any:
    """`value` with long lists cut to their first items and a count, long strings cut."""
    if isinstance(value, dict):
        return {key: _summarised(item) for key, item in value.items()}
    if isinstance(value, list):
        head = [_summarised(item) for item in value[:SUMMARY_LIST_ITEMS]]
        return head + [f"… {len(value):,} in all"] if len(value) > SUMMARY_LIST_ITEMS else head
    if isinstance(value, str) and len(value) > SUMMARY_TEXT_CHARS:
        return value[:SUMMARY_TEXT_CHARS] + f"… ({len(value):,} characters)"
    return value


def _json_text(value: Any, depth: int = 0) -> str:
    """JSON as pretty_json writes it, but a list of plain values on one line (which wraps):
    a hundred numbers take a few lines, not a hundred."""
    pad = " " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(str(k), ensure_ascii=False)}: {_json_text(v, depth + 1)}"
                 for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return "[\n" + ",\n".join(pad + _json_text(v, depth + 1) for v in value) + "\n" + " " * depth + "]"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


@register.filter
def audit_value(value: Any) -> SafeString:
    """An audit row's before or after: its JSON, summarised when long (lists of a hundred
    bucket bounds, a watermark of many partitions), with the whole of it behind "show all"."""
    if value is None or value == "":
        return mark_safe("")
    full = _json_text(value)
    summary = _json_text(_summarised(value))
    lines = summary.splitlines()
    if len(lines) > SUMMARY_LINES:
        summary = "\n".join([*lines[:SUMMARY_LINES - 1], f"… {len(lines) - SUMMARY_LINES + 1} more lines"])
    if summary == full:
        return format_html('<pre class="json">{}</pre>', full)
    return format_html('<pre class="json">{}</pre><details class="json-all"><summary>show all ({} lines)</summary>'
                       '<pre class="json">{}</pre></details>', summary, len(full.splitlines()), full)


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


@register.simple_tag
def region_chart(sizes: Any, width: int = 480, height: int = 96) -> SafeString:
    """Players per region of a season (seasons/staff/season/selectors.SeasonRegionSizes), "no region" last."""
    rows = sizes.sizes
    return staff_charts.bar_chart(
        [r.players for r in rows], labels=[r.region or "no region" for r in rows],
        highlight={i for i, r in enumerate(rows) if not r.listed}, width=width, height=height,
        title="players per region", css_id="region-chart", ticks=True,
    )


@register.filter
def region(value: str | None) -> SafeString:
    """A player's region as the console shows it: <code>eu</code>, or "none" for no region ("")."""
    return format_html("<code>{}</code>", value) if value else mark_safe('<span class="none">none</span>')
