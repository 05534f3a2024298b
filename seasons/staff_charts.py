"""Small inline SVG charts for the staff console, rendered on the server.

No chart library and no JavaScript: each chart is a few dozen SVG elements in the page,
so it renders without scripts and refreshes with the htmx partial it sits in. Every bar
carries a <title> (the browser's tooltip) with its exact value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe


def quantity(value: float) -> str:
    """The console's number format (thousands separators), for the charts' labels and tooltips."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.2f}"


def bar_chart(
    values: Sequence[float], *, labels: Sequence[str] | None = None, width: int = 320, height: int = 64,
    highlight: Container[int] = (), title: str = "", css_id: str = "", axis: tuple[str, str] | None = None,
    ticks: bool = False,
) -> SafeString:
    """Vertical bars scaled to the largest value; indexes in `highlight` get class "hot".

    `axis` = (left, right) labels the ends of the x axis and adds the scale's maximum at
    the top left, in a strip below the bars. `ticks` instead writes each bar's label under
    it (for a few named bars), cut to the bar's width.
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
                     "bar hot" if i in highlight else "bar", f"{label}: {quantity(value)}"))
    bars = format_html_join("", '<rect x="{}" y="{}" width="{}" height="{}" class="{}"><title>{}</title></rect>',
                            rows)
    total_height = height
    extra: SafeString | str = ""
    if ticks:
        total_height = height + 14
        # About 6 px a character at the axis's font size.
        fits = max(int(step // 6), 1)
        extra = format_html_join("", '<text x="{}" y="{}" class="axis" text-anchor="middle">{}</text>', (
            (f"{i * step + bar / 2:.1f}", height + 12, label if len(label) <= fits else label[:max(fits - 1, 1)] + "…")
            for i, label in enumerate(labels or [str(i) for i in range(len(values))])
        ))
    elif axis is not None:
        total_height = height + 14
        extra = format_html(
            '<text x="2" y="{}" class="axis">{}</text><text x="{}" y="{}" class="axis" text-anchor="end">{}</text>'
            '<text x="{}" y="10" class="axis" text-anchor="end">max {}</text>',
            height + 12, axis[0], width - 2, height + 12, axis[1], width - 2, quantity(top),
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
        width, height, width, height, title, title, quantity(low), quantity(high), points,
    )


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above `value` (a y axis's top); 1 for nothing."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    return next(m * scale for m in (1, 2, 2.5, 5, 10) if m * scale >= value * (1 - 1e-9))


def time_chart(
    points: Sequence[tuple[float, float | None]], *, span: float, fmt: Callable[[float], str], title: str,
    span_label: str, css_id: str = "", width: int = 640, height: int = 200,
) -> SafeString:
    """A line over time: `points` are (seconds since the window's start, value), oldest first,
    over a window `span` seconds long that ends now; a None value breaks the line (no data).

    The y axis starts at 0 (a lag of 2 s next to 0.1 s must look like it) and ends at a round
    number; gridlines at 0, half and the top are labelled with `fmt`.
    """
    left, right, top, bottom = 58, 8, 8, 18
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for _, v in points if v is not None]
    ceiling = nice_ceiling(max(values, default=0.0))

    def x(t: float) -> float:
        return left + plot_w * min(max(t / span, 0.0), 1.0)

    def y(v: float) -> float:
        return top + plot_h * (1 - min(v / ceiling, 1.0))

    grid = format_html_join("", '<line x1="{}" y1="{}" x2="{}" y2="{}" class="grid" />'
                            '<text x="{}" y="{}" class="axis" text-anchor="end">{}</text>',
                            ((left, f"{y(v):.1f}", width - right, f"{y(v):.1f}", left - 4, f"{y(v) + 3.5:.1f}",
                              fmt(v) if v else "0") for v in (0.0, ceiling / 2, ceiling)))
    segments: list[list[tuple[float, float]]] = [[]]
    for t, v in points:
        if v is None:
            if segments[-1]:
                segments.append([])
        else:
            segments[-1].append((x(t), y(v)))
    shapes = []
    base = top + plot_h
    for segment in segments:
        if len(segment) == 1:
            shapes.append(format_html('<circle cx="{}" cy="{}" r="2.5" class="dot" />',
                                      f"{segment[0][0]:.1f}", f"{segment[0][1]:.1f}"))
        elif segment:
            line = " ".join(f"{px:.1f},{py:.1f}" for px, py in segment)
            area = f"{segment[0][0]:.1f},{base:.1f} {line} {segment[-1][0]:.1f},{base:.1f}"
            shapes.append(format_html('<polygon points="{}" class="area" /><polyline points="{}" />', area, line))
    body: SafeString | str = mark_safe("".join(shapes)) if shapes else format_html(
        '<text x="{}" y="{}" class="empty" text-anchor="middle">no samples in this window</text>',
        f"{left + plot_w / 2:.1f}", f"{top + plot_h / 2:.1f}")
    axis = format_html(
        '<text x="{}" y="{}" class="axis">−{}</text><text x="{}" y="{}" class="axis" text-anchor="end">now</text>',
        left, height - 4, span_label, width - right, height - 4,
    )
    latest = f"latest {fmt(values[-1])}" if values else "no data"
    return format_html(
        '<svg class="chart time" {} viewBox="0 0 {} {}" role="img" aria-label="{}: {}">'
        "<title>{}: {}</title>{}{}{}</svg>",
        mark_safe(format_html('id="{}"', css_id)) if css_id else "", width, height, title, latest, title, latest,
        grid, body, axis,
    )
