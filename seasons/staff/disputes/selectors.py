"""Reads of disputes: the filtered list, a dispute's notes and its revocations."""

from __future__ import annotations

from django.db.models import QuerySet

from seasons.models import Dispute, DisputeNote, ScoreRevocation


def dispute_notes(*, dispute: Dispute) -> list[DisputeNote]:
    return list(DisputeNote.objects.filter(dispute=dispute).order_by("id"))


def dispute_revocations(*, dispute: Dispute) -> list[ScoreRevocation]:
    return list(ScoreRevocation.objects.filter(dispute=dispute).order_by("-id"))


def disputes_filtered(*, season: str = "", status: str = "", assignee: str = "", player_id: str = "",
                      user_id: int | None = None) -> QuerySet[Dispute]:
    """`status` "active" means open or with a proposed revocation; `assignee` "me", "none" or a user id."""
    qs = Dispute.objects.select_related("season", "assignee").order_by("-id")
    if season:
        qs = qs.filter(season__slug=season)
    if status == "active":
        qs = qs.filter(status__in=[Dispute.Status.OPEN, Dispute.Status.REVOCATION_PROPOSED])
    elif status:
        qs = qs.filter(status=status)
    if assignee == "me" and user_id is not None:
        qs = qs.filter(assignee_id=user_id)
    elif assignee == "none":
        qs = qs.filter(assignee__isnull=True)
    elif assignee.isdigit():
        qs = qs.filter(assignee_id=int(assignee))
    if player_id:
        qs = qs.filter(player_id=player_id)
    return qs
