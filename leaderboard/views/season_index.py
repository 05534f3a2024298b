"""What the epoch and the index build share about a season's index in Redis: its keys,
its tie encoding, the replicas its writes wait for, and the error either raises."""

from __future__ import annotations

from typing import TypedDict

from django.conf import settings

from leaderboard.core.season_options import TIE_BREAK_FIRST_REACHED
from leaderboard.core.tiebreak import FirstReached, first_reached_of
from leaderboard.views import rankview
from seasons.models import Season


class EpochError(RuntimeError):
    pass


class ReplicasWait(TypedDict):
    replicas: int
    replicas_ms: int


def replicas_wait() -> ReplicasWait:
    """copy_finish's durability arguments from the settings (VIEW_REPLICAS_WAIT, _MS)."""
    return {"replicas": settings.VIEW_REPLICAS_WAIT, "replicas_ms": settings.VIEW_REPLICAS_WAIT_MS}


def season_keys(season: Season | str) -> rankview.Keys:
    """The season's rank-view keys (a Season or its slug): the one place the prefix is read."""
    return rankview.Keys(settings.REDIS_KEY_PREFIX, season if isinstance(season, str) else season.slug)


def season_ties(season: Season) -> FirstReached | None:
    """The key encoding of a first_reached season's boards (core.tiebreak), None for a shared one."""
    if season.tie_break != TIE_BREAK_FIRST_REACHED:
        return None
    return first_reached_of(starts_at=season.starts_at, cutoff=season.cutoff)
