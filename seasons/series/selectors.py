"""Reads of a series: its windows, newest first, and the one the clock is in."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from leaderboard.core.series import SERIES_ID_RE, window_of
from seasons.models import Season, Series


def series_get(*, slug: str) -> Series | None:
    if not SERIES_ID_RE.fullmatch(slug) or len(slug) > 48:
        return None
    return Series.objects.filter(slug=slug).first()


def series_current(*, series: Series, now: datetime | None = None) -> Season | None:
    """The window whose span holds `now`, once its season exists."""
    n = window_of(every=series.every, anchor=series.anchor, instant=now or timezone.now())
    return None if n is None else Season.objects.filter(series=series, series_window=n).first()


def series_windows(*, series: Series, limit: int, before: int | None = None) -> list[Season]:
    """Up to `limit` of the series' seasons, newest window first; with `before`, only
    windows numbered below it."""
    seasons = Season.objects.filter(series=series)
    if before is not None:
        seasons = seasons.filter(series_window__lt=before)
    return list(seasons.order_by("-series_window")[:limit])
