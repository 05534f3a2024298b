"""The staff console's series pages: every series, and one series' windows."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from seasons.models import Series
from seasons.series.selectors import series_current, series_windows
from seasons.staff_views.common import context, staff_required

SERIES_PAGE_WINDOWS = 60


@require_GET
@staff_required("console_view")
def series_list(request: HttpRequest) -> HttpResponse:
    return render(request, "staff/series_list.html", context(request, series=Series.objects.all()))


@require_GET
@staff_required("console_view")
def series_page(request: HttpRequest, slug: str) -> HttpResponse:
    """A series' schedule and its windows, newest first, with each one's state; the next
    opening is the start of the window created ahead of its time."""
    series = get_object_or_404(Series, slug=slug)
    windows = series_windows(series=series, limit=SERIES_PAGE_WINDOWS)
    upcoming = [w for w in windows if w.state == "SCHEDULED"]
    return render(request, "staff/series.html", context(
        request, series=series, windows=windows, current=series_current(series=series),
        next_opening=min((w.starts_at for w in upcoming), default=None), shown=SERIES_PAGE_WINDOWS))
