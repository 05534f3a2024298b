from __future__ import annotations

from celery import shared_task

from seasons.services import seasons_lifecycle_tick


@shared_task(ignore_result=True)
def seasons_lifecycle() -> list[str]:
    """Open, close and seal seasons on time; build FINAL candidates once caught up."""
    return seasons_lifecycle_tick()
