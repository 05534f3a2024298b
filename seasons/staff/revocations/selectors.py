"""Reads of score revocations."""

from __future__ import annotations

from django.db.models import QuerySet

from seasons.models import ScoreRevocation


def revocations_filtered(*, status: str = "", season: str = "") -> QuerySet[ScoreRevocation]:
    qs = ScoreRevocation.objects.select_related("season", "dispute").order_by("-id")
    if status:
        qs = qs.filter(status=status)
    if season:
        qs = qs.filter(season__slug=season)
    return qs
