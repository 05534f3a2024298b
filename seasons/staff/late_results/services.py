"""The queue of late results and held corrections: how one is named (it lives in its
ledger database), the score a proposal applying one sets, dismissing one, and restoring
its applied state when the half of an approval committed in its database was lost."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit.models import AuditEntry
from audit.services import Actor, audit_log
from leaderboard.core.events import KIND_CORRECTION
from leaderboard.core.season_options import MODE_SUM, ORDER_ASC
from leaderboard.ingest.ledger_store import counted_points_fetch
from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_atomic
from leaderboard.models import LateResult
from seasons.models import ScoreRevocation, Season
from seasons.staff.common import StaffError, _player_state, _text, _user_id

log = logging.getLogger(__name__)


def late_result_alias_of(late_result: LateResult) -> str:
    """The database a late result was read from. A season's late results live in its
    partitions' databases, each numbering its own: (alias, id) names one."""
    return late_result._state.db or DEFAULT_ALIAS


def late_result_ref(late_result: LateResult) -> str:
    """Its audit target id: the id in "default" (as ever), `alias:id` elsewhere."""
    alias = late_result_alias_of(late_result)
    return str(late_result.pk) if alias == DEFAULT_ALIAS else f"{alias}:{late_result.pk}"


def late_result_name(late_result: LateResult) -> str:
    """How messages name it: its id, with its database outside "default"."""
    return late_result_name_of(alias=late_result_alias_of(late_result), late_result_id=late_result.pk)


def late_result_name_of(*, alias: str, late_result_id: int) -> str:
    """late_result_name for one known by (alias, id) only, its row not read (or not there)."""
    return str(late_result_id) if alias == DEFAULT_ALIAS else f"{late_result_id} (in {alias})"


def _late_result_locked(*, alias: str, late_result_id: int) -> LateResult:
    """The late result, locked in its database (after the revocation and the dispute in
    the lock order, _dispute_locked); the caller holds a transaction there."""
    late_result = (LateResult.objects.using(alias).select_for_update(of=("self",)).select_related("ledger_event")
                   .filter(pk=late_result_id).first())
    if late_result is None:
        raise StaffError(f"late result {late_result_id} (in {alias}) is not in its database")
    return late_result


def _late_result_revocations(late_result: LateResult) -> QuerySet[ScoreRevocation]:
    """The revocations (in "default") applying this late result."""
    return ScoreRevocation.objects.filter(late_result_id=late_result.pk,
                                          late_result_alias=late_result_alias_of(late_result))


def _late_result_applied_save(late_result: LateResult, *, revocation: ScoreRevocation, label: str,
                              now: datetime) -> None:
    late_result.status = LateResult.Status.APPLIED
    late_result.resolved_by_label, late_result.resolved_at = label, now
    late_result.resolution_reason = f"applied through revocation {revocation.pk}: {revocation.reason}"
    late_result.save(update_fields=["status", "resolved_by_label", "resolved_at", "resolution_reason"])


def _late_result_applied_repair(*, alias: str, late_result_id: int) -> ScoreRevocation | None:
    """A late result outside "default" whose revocation was applied (committed in "default",
    audited there with `late_result.applied`) while its own change, committed after in its
    database, was lost: marked applied now, as that revocation's approver left it. Returns
    the revocation when it repaired. In "default" both halves commit together: nothing to do."""
    if alias == DEFAULT_ALIAS:
        return None
    with transaction.atomic(using=alias):
        late_result = _late_result_locked(alias=alias, late_result_id=late_result_id)
        if late_result.status != LateResult.Status.PENDING:
            return None
        applied = _late_result_revocations(late_result).filter(status=ScoreRevocation.Status.APPLIED).first()
        if applied is None:
            return None
        _late_result_applied_save(late_result, revocation=applied, label=applied.decided_by_label,
                                  now=applied.decided_at or timezone.now())
        log.warning("late result %s: its applied state, lost after revocation %s committed, repaired",
                    late_result_name(late_result), applied.pk)
        return applied


class _AppliedHalfLost(Exception):
    """A pending late result found under its lock with an applied revocation naming it:
    that approval committed in "default" after this caller's repair step looked, and its
    change in the late result's database was lost. Raised to roll back the caller's
    transaction (whose work must not commit) before the repair and the refusal."""

    def __init__(self, *, alias: str, late_result_id: int, name: str) -> None:
        super().__init__(name)
        self.alias, self.late_result_id, self.name = alias, late_result_id, name


def _late_result_applied_lost_check(late_result: LateResult) -> None:
    """Under the late result's lock: pending is not enough to act on it outside "default",
    where an applied revocation may name it while its own applied state was lost (the
    repair before the lock ran too early to see that revocation)."""
    alias = late_result_alias_of(late_result)
    if alias == DEFAULT_ALIAS or late_result.status != LateResult.Status.PENDING:
        return
    if _late_result_revocations(late_result).filter(status=ScoreRevocation.Status.APPLIED).exists():
        raise _AppliedHalfLost(alias=alias, late_result_id=late_result.pk, name=late_result_name(late_result))


@contextlib.contextmanager
def _applied_half_lost_refused() -> Iterator[None]:
    """Around (outside) the transaction of a proposal, approval or dismissal: a late result
    found applied by another revocation is marked applied in its database, then refused."""
    try:
        yield
    except _AppliedHalfLost as lost:
        _late_result_applied_repair(alias=lost.alias, late_result_id=lost.late_result_id)
        raise StaffError(f"late result {lost.name} is applied (its applied state, lost in its database, "
                         "is restored)") from None


def late_result_proposal_score(*, late_result: LateResult) -> int:
    """What applying a queued event means: for a late result, the player's best as if it
    had arrived in time; for a held correction, the score it sets (even when lower). In
    a sum season: the sum with the late result's points added, or with the corrected
    result's points amended (staff apply either as the score it comes to)."""
    event = late_result.ledger_event
    # The season from "default": the late result's database holds no Season rows.
    season = Season.objects.get(pk=late_result.season_id)
    if season.mode == MODE_SUM:
        current, _ = _player_state(season, late_result.player_id)
        if event.kind != KIND_CORRECTION or event.corrects is None:
            return (current or 0) + (event.points or 0)
        counted = counted_points_fetch(season_id=season.pk, event_ids=[event.corrects],
                                       using=late_result_alias_of(late_result)).get(event.corrects)
        if counted is None or counted.player_id != late_result.player_id:
            raise StaffError(f"it corrects {event.corrects!r}, which is no counted result of this player")
        return (current or 0) - counted.points + (event.points or 0)
    if event.kind == KIND_CORRECTION:
        return late_result.best_score
    current, _ = _player_state(season, late_result.player_id)
    if current is None:
        return late_result.best_score
    # The better of the two: the lower in an asc season.
    return (min if season.order == ORDER_ASC else max)(current, late_result.best_score)


def late_result_dismiss(*, late_result: LateResult, actor: Actor, reason: str) -> LateResult:
    """Dismiss a pending late result: its state changes in its database, its audit row is
    written in "default". In "default" both commit in one transaction. Elsewhere they cannot:
    the state change commits first, then the audit row; dismissing it again after the
    second was lost writes the missing audit row (once), and otherwise refuses as a
    dismissed one."""
    _user_id(actor)
    reason = _text(reason, field="a reason")
    alias = late_result_alias_of(late_result)
    _late_result_applied_repair(alias=alias, late_result_id=late_result.pk)
    with _applied_half_lost_refused(), transaction.atomic() if alias == DEFAULT_ALIAS else contextlib.nullcontext():
        with transaction.atomic(using=alias):
            locked = _late_result_locked(alias=alias, late_result_id=late_result.pk)
            dismissed_now = locked.status == LateResult.Status.PENDING
            if dismissed_now:
                _late_result_applied_lost_check(locked)
                if _late_result_revocations(locked).filter(status=ScoreRevocation.Status.PROPOSED).exists():
                    raise StaffError("a correction applying this late result is proposed: reject it first")
                locked.status = LateResult.Status.DISMISSED
                locked.resolved_by_label, locked.resolved_at, locked.resolution_reason = (
                    actor.label, timezone.now(), reason)
                locked.save(update_fields=["status", "resolved_by_label", "resolved_at", "resolution_reason"])
            elif locked.status != LateResult.Status.DISMISSED:
                raise StaffError(f"late result {late_result_name(locked)} is {locked.status}")
        return _late_result_dismissal_audit(alias=alias, late_result=locked, actor=actor,
                                            dismissed_now=dismissed_now)


def _late_result_dismissal_audit(*, alias: str, late_result: LateResult, actor: Actor,
                                 dismissed_now: bool) -> LateResult:
    """The dismissal's audit row, unless it is written already; under the late result's lock,
    so two dismissals sent again at once write one."""
    season = Season.objects.get(pk=late_result.season_id)
    with ledger_atomic(aliases=[alias, DEFAULT_ALIAS]):
        locked = _late_result_locked(alias=alias, late_result_id=late_result.pk)
        audited = AuditEntry.objects.filter(action="late_result.dismissed", target_type="late_result",
                                            target_id=late_result_ref(locked), season_slug=season.slug).exists()
        if audited:
            if not dismissed_now:
                raise StaffError(f"late result {late_result_name(locked)} is {locked.status}")
            return locked
        audit_log(actor=actor, action="late_result.dismissed", target_type="late_result",
                  target_id=late_result_ref(locked), season_slug=season.slug,
                  before={"status": LateResult.Status.PENDING},
                  after={"status": locked.status, "player_id": locked.player_id, "best_score": locked.best_score,
                         "database": alias, "dismissed_by": locked.resolved_by_label},
                  reason=locked.resolution_reason)
    return locked
