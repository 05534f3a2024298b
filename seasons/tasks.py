from __future__ import annotations

from celery import shared_task

from seasons.series.services import series_tick
from seasons.services import seasons_lifecycle_tick


@shared_task(ignore_result=True)
def seasons_lifecycle() -> list[str]:
    """Open every series window due, then open, close and seal seasons on time and build
    FINAL candidates once caught up (approving those of series with automatic approval)."""
    return series_tick() + seasons_lifecycle_tick()
