"""Reads of FINAL candidates."""

from __future__ import annotations

from seasons.models import FinalCandidate, Season


def final_candidates(*, season: Season) -> list[FinalCandidate]:
    return list(FinalCandidate.objects.filter(season=season).order_by("-id")[:20])
