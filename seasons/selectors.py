from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from leaderboard.core.events import id_is_valid
from leaderboard.core.final_hash import FinalLineFormat
from leaderboard.core.lifecycle import SeasonState, transition_offered
from leaderboard.core.season_options import TIE_BREAK_FIRST_REACHED
from leaderboard.models import Manifest as ManifestRow
from seasons.models import FinalCandidate, FinalCorrection, FinalStanding, Season


def season_get(*, slug: str) -> Season | None:
    # An id outside the id rule names no season; PostgreSQL would refuse a NUL with an error.
    if not id_is_valid(slug):
        return None
    return Season.objects.filter(slug=slug).first()


def final_manifest_get(*, season: Season) -> ManifestRow | None:
    if season.final_version is None:
        return None
    return ManifestRow.objects.filter(season=season, version=season.final_version, is_final=True).first()


def final_candidate_approved(*, season: Season) -> FinalCandidate | None:
    return season.final_candidates.filter(status=FinalCandidate.Status.APPROVED).first()


def final_standings_window(*, season: Season, from_position: int, limit: int) -> list[FinalStanding]:
    return list(
        FinalStanding.objects.filter(season=season, position__gte=from_position).order_by("position")[:limit]
    )


def final_regional_window(*, season: Season, region: str, from_position: int, limit: int) -> list[FinalStanding]:
    """A page of one region's FINAL standings, from its regional position `from_position`."""
    return list(
        FinalStanding.objects.filter(season=season, region=region, regional_position__gte=from_position)
        .order_by("regional_position")[:limit]
    )


def final_line_format(*, season: Season) -> FinalLineFormat:
    """The content hash's line of this season's FINAL standings (core.final_hash)."""
    return FinalLineFormat(first_reached=season.tie_break == TIE_BREAK_FIRST_REACHED, regional=season.final_regional,
                           tiered=bool(season.tiers))


def final_standing_get(*, season: Season, player_id: str) -> FinalStanding | None:
    return FinalStanding.objects.filter(season=season, player_id=player_id).first()


def final_corrections_list(*, season: Season) -> list[FinalCorrection]:
    return list(FinalCorrection.objects.filter(season=season).order_by("id"))


@dataclass(frozen=True, slots=True)
class LifecycleOffer:
    """What the console offers on a season's lifecycle now: the transitions staff can make
    (each would succeed), and when the clock makes the next one by itself."""

    open: bool
    close: bool
    seal: bool
    # FINALIZING with no candidate for the current version: the tick builds one, and staff may too.
    build: bool
    # When the clock opens, closes or seals the season by itself (None: it does not).
    opens_at: datetime | None
    closes_at: datetime | None
    seals_at: datetime | None


def season_lifecycle_offer(*, season: Season, now: datetime | None = None) -> LifecycleOffer:
    now = now or timezone.now()

    def offered(target: str) -> bool:
        return transition_offered(state=season.state, target=target, now=now, cutoff=season.cutoff)

    seal_after = settings.SEAL_AFTER_CUTOFF_SECONDS
    state = season.state
    return LifecycleOffer(
        open=offered(SeasonState.OPEN), close=offered(SeasonState.CLOSING), seal=offered(SeasonState.FINALIZING),
        build=state == SeasonState.FINALIZING and final_candidate_current(season=season) is None,
        opens_at=season.starts_at if state == SeasonState.SCHEDULED else None,
        closes_at=season.cutoff if state == SeasonState.OPEN else None,
        seals_at=(season.cutoff + timedelta(seconds=seal_after)
                  if state in (SeasonState.OPEN, SeasonState.CLOSING) and seal_after is not None else None),
    )


def final_candidate_current(*, season: Season) -> FinalCandidate | None:
    """A built or proposed FINAL candidate of the season's current version: while there is
    one, nothing new to build (the lifecycle tick asks the same)."""
    return season.final_candidates.filter(
        status__in=[FinalCandidate.Status.BUILT, FinalCandidate.Status.PROPOSED], version=season.published_version,
    ).first()
