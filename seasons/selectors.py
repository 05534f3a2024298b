from __future__ import annotations

from seasons.models import Season


def season_get(*, slug: str) -> Season | None:
    return Season.objects.filter(slug=slug).first()
