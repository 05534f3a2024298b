from __future__ import annotations

from django.db import models

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.lifecycle import SeasonState


def default_layout() -> dict[str, object]:
    return BucketLayout.uniform().as_dict()


class Season(models.Model):
    """A season: its public id is the slug (the {season_id} of every URL)."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    state = models.CharField(
        max_length=16,
        choices=[(s.value, s.value) for s in SeasonState],
        default=SeasonState.SCHEDULED.value,
    )
    starts_at = models.DateTimeField()
    cutoff = models.DateTimeField()
    # The last published leaderboard version (0 until the first epoch publishes);
    # writes answer pending_version from it without touching Redis.
    published_version = models.BigIntegerField(default=0)
    # The bucket layout new versions are built with (CONTRACT.md 4; 101 x 10,000 points
    # unless the season was created with another).
    layout = models.JSONField(default=default_layout)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-starts_at", "slug"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(cutoff__gt=models.F("starts_at")), name="season_cutoff_after_start"
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def bucket_layout(self) -> BucketLayout:
        return BucketLayout.from_dict(self.layout)
