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
    # Ingest seal (CLOSING -> FINALIZING): every change at or below this change-stream
    # cursor is in the season; pre-cutoff results arriving later go to the late queue.
    sealed_at = models.DateTimeField(null=True, blank=True)
    ingest_watermark_txid = models.BigIntegerField(null=True, blank=True)
    ingest_watermark_id = models.BigIntegerField(null=True, blank=True)
    final_version = models.BigIntegerField(null=True, blank=True)
    finalized_at = models.DateTimeField(null=True, blank=True)

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


class FinalCandidate(models.Model):
    """A version proposed as the FINAL standings, with its reconciliation against the ledger."""

    class Status(models.TextChoices):
        BUILT = "built"
        PROPOSED = "proposed"
        APPROVED = "approved"
        REJECTED = "rejected"
        SUPERSEDED = "superseded"

    season = models.ForeignKey(Season, on_delete=models.PROTECT, related_name="final_candidates")
    version = models.BigIntegerField()
    built_at = models.DateTimeField()
    report = models.JSONField()
    reconciliation_ok = models.BooleanField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.BUILT)
    proposed_by = models.CharField(max_length=64, blank=True)
    proposed_by_label = models.CharField(max_length=200, blank=True)
    proposed_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=64, blank=True)
    decided_by_label = models.CharField(max_length=200, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.season.slug} v{self.version} ({self.status})"


class FinalStanding(models.Model):
    """One row of the approved FINAL standings: durable, immutable, what rewards are paid from."""

    season = models.ForeignKey(Season, on_delete=models.PROTECT, related_name="+")
    position = models.BigIntegerField()
    rank = models.BigIntegerField()
    player_id = models.CharField(max_length=64)
    score = models.IntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["season", "position"], name="final_standing_unique_position"),
            models.UniqueConstraint(fields=["season", "player_id"], name="final_standing_unique_player"),
        ]


class FinalCorrection(models.Model):
    """A change to a FINAL season's board: listed beside the FINAL, never written into it."""

    season = models.ForeignKey(Season, on_delete=models.PROTECT, related_name="+")
    player_id = models.CharField(max_length=64)
    score_before = models.IntegerField(null=True)
    score_after = models.IntegerField()
    event_id = models.CharField(max_length=64)
    pending_version = models.BigIntegerField(null=True)
    actor_label = models.CharField(max_length=200)
    reason = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
