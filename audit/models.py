from __future__ import annotations

from django.db import models


class AuditEntry(models.Model):
    """One append-only row per staff action or lifecycle transition (CONTRACT.md 6)."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # Who: a staff user, an API client, or the system (beat, a management command).
    actor_type = models.CharField(max_length=16)
    actor_id = models.CharField(max_length=64, blank=True)
    actor_label = models.CharField(max_length=200)
    action = models.CharField(max_length=100, db_index=True)
    target_type = models.CharField(max_length=50)
    target_id = models.CharField(max_length=100)
    season_slug = models.CharField(max_length=64, blank=True, db_index=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.target_type}:{self.target_id}"
