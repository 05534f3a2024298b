"""Writes of the seasons app."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_log
from leaderboard.core.buckets import BucketLayout
from leaderboard.core.lifecycle import initial_state
from seasons.models import Season


class SeasonError(ValueError):
    pass


def season_create(
    *,
    slug: str,
    name: str,
    starts_at: datetime,
    cutoff: datetime,
    actor: Actor,
    layout: BucketLayout | None = None,
) -> Season:
    if cutoff <= starts_at:
        raise SeasonError("the cutoff must be after the start")
    if Season.objects.filter(slug=slug).exists():
        raise SeasonError(f"a season {slug!r} already exists")
    state = initial_state(starts_at=starts_at, cutoff=cutoff, now=timezone.now())
    with transaction.atomic():
        season = Season.objects.create(
            slug=slug, name=name, starts_at=starts_at, cutoff=cutoff, state=state.value,
            layout=(layout or BucketLayout.uniform()).as_dict(),
        )
        audit_log(
            actor=actor,
            action="season.created",
            target_type="season",
            target_id=slug,
            season_slug=slug,
            after={
                "name": name, "state": season.state,
                "starts_at": starts_at.isoformat(), "cutoff": cutoff.isoformat(),
                "buckets": len(season.layout["lower_bounds"]),
            },
        )
    return season
