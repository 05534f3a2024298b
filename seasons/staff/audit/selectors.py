"""Reads of the audit trail: filtered, newest first."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from audit.models import AuditEntry


def audit_filtered(*, season: str = "", actor: str = "", action: str = "", date_from: Any = None,
                   date_to: Any = None) -> QuerySet[AuditEntry]:
    """Newest first. `action` matches a prefix ("dispute." finds every dispute action); dates are inclusive days."""
    qs = AuditEntry.objects.order_by("-seq")
    if season:
        qs = qs.filter(season_slug=season)
    if actor:
        qs = qs.filter(actor_label=actor)
    if action:
        qs = qs.filter(action__startswith=action)
    if date_from:
        qs = qs.filter(created_at__date__gte=date_from)
    if date_to:
        qs = qs.filter(created_at__date__lte=date_to)
    return qs
