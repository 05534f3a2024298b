"""Disputes: filing one (from the console or the support tools' API), assigning it,
its notes, rejecting it. A dispute is resolved by a score revocation
(seasons/staff/revocations/services.py)."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.services import Actor, audit_log
from seasons.models import Dispute, DisputeNote, Season
from seasons.staff.common import StaffError, _player, _score, _text, _user_id


def dispute_file(
    *, season: Season, player_id: str, summary: str, actor: Actor, source: str = Dispute.Source.CONSOLE,
    details: str = "", claimed_score: int | None = None, match_id: str = "", external_ref: str = "",
) -> tuple[Dispute, bool]:
    """File a dispute; returns (dispute, created). A known `external_ref` returns the first one unchanged."""
    player_id = _player(player_id)
    summary = _text(summary, field="summary", limit=200)
    details = _text(details, field="details", required=False, limit=10_000)
    match_id = _text(match_id, field="match id", required=False, limit=64)
    external_ref = _text(external_ref, field="external reference", required=False, limit=100)
    if claimed_score is not None:
        _score(claimed_score, field="claimed score", high=season.max_score)
    if external_ref:
        existing = Dispute.objects.filter(season=season, external_ref=external_ref).first()
        if existing is not None:
            return existing, False
    now = timezone.now()
    try:
        with transaction.atomic():
            dispute = Dispute.objects.create(
                season=season, player_id=player_id, summary=summary, details=details, claimed_score=claimed_score,
                match_id=match_id, external_ref=external_ref, source=source, filed_by_label=actor.label,
                created_at=now, updated_at=now,
            )
            audit_log(actor=actor, action="dispute.filed", target_type="dispute", target_id=str(dispute.pk),
                      season_slug=season.slug,
                      after={"player_id": player_id, "summary": summary, "claimed_score": claimed_score,
                             "match_id": match_id, "source": source, "external_ref": external_ref})
    except IntegrityError:
        # Two deliveries of the same ticket raced: the other one's row is the dispute.
        existing = Dispute.objects.filter(season=season, external_ref=external_ref).first()
        if existing is None or not external_ref:
            raise
        return existing, False
    return dispute, True


def _dispute_locked(dispute: Dispute) -> Dispute:
    # Lock order, in every service of seasons/staff/: the revocation row, then its dispute,
    # then its late result, then the season's write lock (score_events_apply), and the
    # audit chain's head last (audit_log). Two actions on one dispute then queue behind
    # each other; taken the other way round (a decision holding the audit head while it
    # waits for the dispute a note holds) PostgreSQL kills one of them as a deadlock.
    # FOR UPDATE OF the dispute only: the joined season row must stay unlocked (epochs and
    # lifecycle transitions lock it), and the assignee is an outer join PostgreSQL cannot lock.
    return Dispute.objects.select_for_update(of=("self",)).select_related("season", "assignee").get(pk=dispute.pk)


def dispute_assign(*, dispute: Dispute, assignee: Any | None, actor: Actor) -> Dispute:
    _user_id(actor)
    with transaction.atomic():
        locked = _dispute_locked(dispute)
        if not locked.is_open:
            raise StaffError(f"dispute {locked.pk} is {locked.status}")
        before = locked.assignee.get_username() if locked.assignee else None
        locked.assignee = assignee
        locked.updated_at = timezone.now()
        locked.save(update_fields=["assignee", "updated_at"])
        audit_log(actor=actor, action="dispute.assigned", target_type="dispute", target_id=str(locked.pk),
                  season_slug=locked.season.slug, before={"assignee": before},
                  after={"assignee": assignee.get_username() if assignee else None})
    return locked


def dispute_note_add(*, dispute: Dispute, text: str, actor: Actor) -> DisputeNote:
    author_id = _user_id(actor)
    text = _text(text, field="note", limit=10_000)
    with transaction.atomic():
        locked = _dispute_locked(dispute)
        note = DisputeNote.objects.create(dispute=locked, author_id=author_id, author_label=actor.label, text=text,
                                          created_at=timezone.now())
        Dispute.objects.filter(pk=locked.pk).update(updated_at=note.created_at)
        audit_log(actor=actor, action="dispute.note_added", target_type="dispute", target_id=str(locked.pk),
                  season_slug=locked.season.slug, after={"note_id": note.pk, "text": text})
    return note


def dispute_reject(*, dispute: Dispute, reason: str, actor: Actor) -> Dispute:
    _user_id(actor)
    reason = _text(reason, field="a reason")
    with transaction.atomic():
        locked = _dispute_locked(dispute)
        if locked.status != Dispute.Status.OPEN:
            raise StaffError(
                f"dispute {locked.pk} is {locked.status}"
                + ("; reject its proposed revocation first" if locked.status == Dispute.Status.REVOCATION_PROPOSED
                   else "")
            )
        locked.status = Dispute.Status.REJECTED
        locked.resolution_reason, locked.resolved_by_label = reason, actor.label
        locked.resolved_at = locked.updated_at = timezone.now()
        locked.save(update_fields=["status", "resolution_reason", "resolved_by_label", "resolved_at", "updated_at"])
        audit_log(actor=actor, action="dispute.rejected", target_type="dispute", target_id=str(locked.pk),
                  season_slug=locked.season.slug, before={"status": Dispute.Status.OPEN},
                  after={"status": locked.status}, reason=reason)
    return locked
