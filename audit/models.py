from __future__ import annotations

from django.db import models
from django.utils import timezone


class AuditEntry(models.Model):
    """One append-only row per staff action or lifecycle transition (docs/rules.md, Staff roles and the audit trail).

    Rows form a hash chain (audit/chain.py): `row_hash` covers the row's content and the
    previous row's hash, so editing, removing or reordering a row breaks the chain at that
    row. The database refuses UPDATE (and DELETE on PostgreSQL) on this table (migration 0002).
    """

    # Set explicitly by audit_log (not auto_now_add): the timestamp is part of the hash,
    # so it must be known before the row is written.
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
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
    # Position in the chain: 1, 2, 3, ... with no gaps (a gap is a deleted row).
    seq = models.BigIntegerField(unique=True)
    prev_hash = models.CharField(max_length=64)
    row_hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return (f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} "
                f"{self.target_type}:{self.target_id}")


class AuditChainHead(models.Model):
    """The single row (pk=1) every writer locks before appending: one chain, never forked.

    It also records the last sequence number and hash, so the verifier notices rows cut
    off the end of the chain (which leave every remaining link intact).
    """

    seq = models.BigIntegerField(default=0)
    row_hash = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
