"""Small inline SVG charts for the staff console, rendered on the server.

No chart library and no JavaScript: each chart is a few dozen SVG elements in the page,
so it renders without scripts and refreshes with the htmx partial it sits in. Every bar
carries a <title> (the browser's tooltip) with its exact value.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe


def bar_chart(
    values: Sequence[float], *, labels: Sequence[str] | None = None, width: int = 320, height: int = 64,
    highlight: Container[int] = (), title: str = "", css_id: str = "", axis: tuple[str, str] | None = None,
) -> SafeString:
    """Vertical bars scaled to the largest value; indexes in `highlight` get class "hot".

    `axis` = (left, right) labels the ends of the x axis and adds the scale's maximum at
    the top left, in a strip below the bars.
    """
    count = max(len(values), 1)
    top = max(values, default=0) or 1
    step = width / count
    bar = max(step - 1, 1)
    rows = []
    for i, value in enumerate(values):
        h = 0 if value <= 0 else max(height * value / top, 1)
        label = labels[i] if labels is not None else str(i)
        rows.append((f"{i * step:.1f}", f"{height - h:.1f}", f"{bar:.1f}", f"{h:.1f}",
                     "bar hot" if i in highlight else "bar", f"{label}: {value:g}"))
    bars = format_html_join("", '<rect x="{}" y="{}" width="{}" height="{}" class="{}"><title>{}</title></rect>',
                            rows)
    total_height = height
    extra: SafeString | str = ""
    if axis is not None:
        total_height = height + 14
        extra = format_html(
            '<text x="2" y="{}" class="axis">{}</text><text x="{}" y="{}" class="axis" text-anchor="end">{}</text>'
            '<text x="{}" y="10" class="axis" text-anchor="end">max {}</text>',
            height + 12, axis[0], width - 2, height + 12, axis[1], width - 2, f"{top:g}",
        )
    return format_html(
        '<svg class="chart" {} viewBox="0 0 {} {}" width="{}" height="{}" role="img" aria-label="{}">'
        "<title>{}</title>{}{}</svg>",
        mark_safe(format_html('id="{}"', css_id)) if css_id else "", width, total_height, width, total_height, title,
        title, bars, extra,
    )


def sparkline(values: Sequence[float], *, width: int = 160, height: int = 32, title: str = "") -> SafeString:
    """A polyline of the values, oldest first, scaled between their minimum and maximum."""
    if len(values) < 2:
        return format_html('<svg class="chart spark" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
                           'aria-label="{}"><title>{}: not enough data yet</title></svg>',
                           width, height, width, height, title, title)
    low, high = min(values), max(values)
    span = (high - low) or 1
    step = width / (len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (height - 4) * (v - low) / span:.1f}" for i, v in enumerate(values)
    )
    return format_html(
        '<svg class="chart spark" viewBox="0 0 {} {}" width="{}" height="{}" role="img" aria-label="{}">'
        '<title>{}: {} .. {}</title><polyline points="{}" /></svg>',
        width, height, width, height, title, title, f"{low:g}", f"{high:g}", points,
    )
