"""Two-person score revocations: propose, re-propose on the player's state now (rebase),
approve (through the ledger, like any match result) or reject. An applied revocation
closes the dispute or late result it came from."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from audit.selectors import staff_role_granters
from audit.services import Actor, audit_log
from leaderboard.core.events import KIND_CORRECTION, MAX_REASON_LENGTH, ScoreEvent
from leaderboard.core.ledger import APPLIED, DUPLICATE, Outcome
from leaderboard.core.lifecycle import two_person_refusal
from leaderboard.core.season_options import MODE_SUM
from leaderboard.ingest.services import score_events_apply
from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_aliases, ledger_atomic
from leaderboard.models import LateResult
from seasons.models import Dispute, ScoreRevocation, Season
from seasons.staff.common import StaffError, _player, _player_state, _score, _text, _user_id
from seasons.staff.disputes.services import _dispute_locked
from seasons.staff.late_results.services import (
    _applied_half_lost_refused,
    _late_result_applied_lost_check,
    _late_result_applied_repair,
    _late_result_applied_save,
    _late_result_locked,
    _late_result_revocations,
    late_result_alias_of,
    late_result_name,
    late_result_ref,
)


def score_revocation_propose(
    *, season: Season, player_id: str, new_score: int, reason: str, actor: Actor, evidence: str = "",
    public_reason: str = "", dispute: Dispute | None = None, late_result: LateResult | None = None,
) -> ScoreRevocation:
    """Propose a corrected absolute score, based on the player's current score and version."""
    proposer_id = _user_id(actor)
    player_id = _player(player_id)
    _score(new_score, field="new score", high=season.max_score)
    # The reason travels into the ledger event, which holds at most 500 characters.
    reason = _text(reason, field="a reason", limit=MAX_REASON_LENGTH)
    evidence = _text(evidence, field="evidence", required=False, limit=10_000)
    public_reason = _text(public_reason, field="public reason", required=False, limit=200)
    late_alias = late_result_alias_of(late_result) if late_result is not None else DEFAULT_ALIAS
    if late_result is not None:
        _late_result_applied_repair(alias=late_alias, late_result_id=late_result.pk)
    # The late result's lock (in its database) is held until the revocation commits in
    # "default": a dismissal waiting on it then finds the proposal.
    with _applied_half_lost_refused(), ledger_atomic(aliases=[late_alias, DEFAULT_ALIAS]):
        if dispute is not None:
            dispute = _dispute_locked(dispute)
            if dispute.season_id != season.pk or dispute.player_id != player_id:
                raise StaffError("the revocation must be for the disputed player of the dispute's season")
            if dispute.status == Dispute.Status.REVOCATION_PROPOSED:
                raise StaffError(f"dispute {dispute.pk} already has a proposed revocation")
            if dispute.status != Dispute.Status.OPEN:
                raise StaffError(f"dispute {dispute.pk} is {dispute.status}")
        if late_result is not None:
            late_result = _late_result_locked(alias=late_alias, late_result_id=late_result.pk)
            _late_result_applied_lost_check(late_result)
            name = late_result_name(late_result)
            if late_result.season_id != season.pk or late_result.player_id != player_id:
                raise StaffError("the revocation must be for the late result's player and season")
            if late_result.status != LateResult.Status.PENDING:
                raise StaffError(f"late result {name} is {late_result.status}")
            if _late_result_revocations(late_result).filter(status=ScoreRevocation.Status.PROPOSED).exists():
                raise StaffError(f"late result {name} already has a proposed correction")
        score_before, base_version = _player_state(season, player_id)
        revocation = ScoreRevocation.objects.create(
            season=season, player_id=player_id, score_before=score_before, base_version=base_version,
            new_score=new_score, reason=reason, evidence=evidence, public_reason=public_reason, dispute=dispute,
            # By id and alias: assigning the row would place the revocation in the row's database.
            late_result_id=late_result.pk if late_result else None, late_result_alias=late_alias,
            proposed_by_id=proposer_id, proposed_by_label=actor.label, proposed_at=timezone.now(),
        )
        if dispute is not None:
            dispute.status = Dispute.Status.REVOCATION_PROPOSED
            dispute.updated_at = revocation.proposed_at
            dispute.save(update_fields=["status", "updated_at"])
        audit_log(actor=actor, action="revocation.proposed", target_type="revocation", target_id=str(revocation.pk),
                  season_slug=season.slug, before={"score": score_before, "score_version": base_version},
                  after={"player_id": player_id, "score": new_score, "evidence": evidence,
                         "dispute": dispute.pk if dispute else None,
                         "late_result": late_result.pk if late_result else None,
                         **({"late_result_database": late_alias} if late_result else {})},
                  reason=reason)
    return revocation


@dataclass(frozen=True, slots=True)
class ApprovalResult:
    revocation: ScoreRevocation
    status: str  # the ledger outcome: applied | stale | rejected | ...
    detail: str

    @property
    def applied(self) -> bool:
        return self.status == APPLIED


# An approval's attempt recorded before its ledger write, whose outcome is not recorded yet
# (a season with partitions outside "default": score_revocation_approve).
APPROVAL_PENDING = "pending"


def _correction_time(season: Season, late_result: LateResult | None, proposed_at: datetime) -> datetime:
    # The ledger admits a correction only with a completed_at inside the season; a late
    # result keeps its own (pre-cutoff) time. From the proposal, not the clock: an
    # interrupted approval sends the same payload again.
    if late_result is not None:
        return late_result.completed_at
    return max(min(proposed_at, season.cutoff), season.starts_at)


def _revocation_proposed_locked(revocation: ScoreRevocation) -> ScoreRevocation:
    """The revocation, locked (first in the lock order), while it still awaits a decision."""
    locked = ScoreRevocation.objects.select_for_update(of=("self",)).select_related("season").get(pk=revocation.pk)
    if locked.status != ScoreRevocation.Status.PROPOSED:
        raise StaffError(f"revocation {locked.pk} is {locked.status}")
    return locked


def _approval_not_pending(revocation: ScoreRevocation) -> None:
    """An interrupted approval may have changed the ledger already: only approving again,
    which finds out and records it, may follow it."""
    if revocation.last_outcome == APPROVAL_PENDING:
        raise StaffError(f"an approval of revocation {revocation.pk} was interrupted and may have changed the "
                         "score already: approve it again to finish it")


def score_revocation_rebase(*, revocation: ScoreRevocation, actor: Actor, reason: str = "") -> ScoreRevocation:
    """Base a proposal on the player's state now, after the match service moved them.

    Whoever rebases saw the new state and proposes the correction on it: they become its
    proposer, so another staff member, who sees the same state, must approve it. (An
    approver who rebased and approved alone would apply a correction on a state no second
    person had looked at.)
    """
    rebaser_id = _user_id(actor)
    reason = _text(reason, field="reason", required=False, limit=10_000)
    with transaction.atomic():
        locked = _revocation_proposed_locked(revocation)
        _approval_not_pending(locked)
        before = {"score": locked.score_before, "score_version": locked.base_version,
                  "proposed_by": locked.proposed_by_label}
        locked.score_before, locked.base_version = _player_state(locked.season, locked.player_id)
        locked.proposed_by_id, locked.proposed_by_label, locked.proposed_at = rebaser_id, actor.label, timezone.now()
        locked.last_outcome, locked.last_outcome_detail = "", ""
        locked.save(update_fields=["score_before", "base_version", "proposed_by", "proposed_by_label", "proposed_at",
                                   "last_outcome", "last_outcome_detail"])
        audit_log(actor=actor, action="revocation.rebased", target_type="revocation", target_id=str(locked.pk),
                  season_slug=locked.season.slug, before=before,
                  after={"score": locked.score_before, "score_version": locked.base_version,
                         "proposed_by": locked.proposed_by_label},
                  reason=reason)
    return locked


def score_revocation_approve(*, revocation: ScoreRevocation, actor: Actor, reason: str = "") -> ApprovalResult:
    """A second staff member approves: the correction goes through the ledger like any match result.

    The event's version is the proposal's base version + 1. When the match service moved
    the player meanwhile the ledger answers `stale`: nothing changes, the proposal stays
    open with the new state shown, and a staff member may re-propose it on the player's
    state now (score_revocation_rebase), for another to approve.

    A season whose ledger is all in "default" commits the ledger row, the revocation's
    state and the audit row together. One with partitions in another database cannot (the
    ledger write commits there on its own, and refuses to run inside a transaction): the
    attempt is recorded first (last_outcome "pending"), the correction applied outside any
    transaction, its outcome recorded after. An approval interrupted between the two is
    approved again with the same event (same id, same payload), which the ledger answers
    `duplicate` of an applied event: that counts as applied, and the approval completes.
    """
    approver_id = _user_id(actor)
    reason = _text(reason, field="reason", required=False, limit=10_000)
    season = Season.objects.get(pk=revocation.season_id)
    repaired = _approval_late_result_repair(revocation=revocation)
    if repaired is not None:
        return repaired
    one_transaction = list(ledger_aliases(season=season)) == [DEFAULT_ALIAS]
    with _applied_half_lost_refused(), transaction.atomic() if one_transaction else contextlib.nullcontext():
        locked, event = _approval_attempt_begin(revocation=revocation, actor=actor, approver_id=approver_id)
        outcome = score_events_apply(season=locked.season, events=[event], client=None, actor=actor,
                                     public_reason=locked.public_reason).outcomes[0]
        return _approval_attempt_finish(revocation=locked, event=event, outcome=outcome, actor=actor,
                                        approver_id=approver_id, reason=reason)


def _approval_attempt_begin(*, revocation: ScoreRevocation, actor: Actor, approver_id: int,
                            ) -> tuple[ScoreRevocation, ScoreEvent]:
    """Check the approval and record its attempt; returns the revocation and the attempt's event.

    An attempt whose outcome was never recorded (`pending`) is sent again as it was: its
    completed_at derives from the proposal (not the clock), so the resend carries the
    same payload and the ledger recognizes it."""
    with ledger_atomic(aliases=[revocation.late_result_alias, DEFAULT_ALIAS]):
        locked = _revocation_proposed_locked(revocation)
        if locked.proposed_by_id == approver_id:
            raise StaffError("nobody approves their own proposal: another approver must do it")
        refusal = two_person_refusal(proposer_id=locked.proposed_by_id, approver_id=approver_id,
                                     approver_granted_by=staff_role_granters(user_id=approver_id))
        if refusal is not None:
            raise StaffError(refusal)
        # The dispute before the late result, the season lock and the audit head (_dispute_locked):
        # in one transaction (a season all in "default") they stay held until the outcome.
        if locked.dispute_id:
            _dispute_locked(locked.dispute)  # type: ignore[arg-type]
        late_result = (_late_result_locked(alias=locked.late_result_alias, late_result_id=locked.late_result_id)
                       if locked.late_result_id else None)
        if late_result is not None:
            # Another revocation applied it (a proposal that raced that approval's lost half).
            _late_result_applied_lost_check(late_result)
        if late_result is not None and late_result.status != LateResult.Status.PENDING:
            raise StaffError(f"late result {late_result_name(late_result)} is {late_result.status}")
        if locked.last_outcome != APPROVAL_PENDING or not locked.attempts:
            score_now, version_now = _player_state(locked.season, locked.player_id)
            if version_now > locked.base_version and score_now == locked.score_before:
                # Only the version moved (results that left the score as it was): the state
                # both people looked at stands, so the correction follows the version now.
                # The approval's audit row records the version it was based on.
                locked.base_version = version_now
            locked.attempts += 1
            locked.last_outcome = APPROVAL_PENDING
            locked.save(update_fields=["attempts", "last_outcome", "base_version"])
        season = locked.season
        event = ScoreEvent(
            event_id=f"staff-revocation-{locked.pk}-{locked.attempts}", match_id=f"staff-revocation-{locked.pk}",
            player_id=locked.player_id, best_score=locked.new_score, score_version=locked.base_version + 1,
            completed_at=_correction_time(season, late_result, locked.proposed_at), kind=KIND_CORRECTION,
            reason=locked.reason,
        )
        held = late_result.ledger_event if late_result is not None else None
        if season.mode == MODE_SUM and held is not None and held.corrects is not None:
            # A sum season's held amendment is applied as itself (the result it corrects,
            # its points and version), so a later amendment of that result counts from it;
            # the proposal's score is the sum it came to when proposed.
            event = replace(event, best_score=0, score_version=held.score_version, points=held.points,
                            corrects=held.corrects)
    return locked, event


def _approval_attempt_finish(*, revocation: ScoreRevocation, event: ScoreEvent, outcome: Outcome, actor: Actor,
                             approver_id: int, reason: str) -> ApprovalResult:
    """Record an attempt's outcome with its audit row (and close what an applied one
    resolves). Another approval that recorded its outcome first wins: an attempt that
    changed nothing leaves it as it is."""
    # A resent attempt's outcome is the one its first sending got.
    status = (outcome.first_status or outcome.status) if outcome.status == DUPLICATE else outcome.status
    applied = status == APPLIED
    # A late result outside "default" changes in its own database, committed after "default"
    # (ledger_atomic commits in reverse order): when that commit is lost, the applied
    # revocation names it, and the next action on either completes it
    # (_late_result_applied_repair).
    with ledger_atomic(aliases=[revocation.late_result_alias, DEFAULT_ALIAS]):
        locked = ScoreRevocation.objects.select_for_update(of=("self",)).select_related("season").get(
            pk=revocation.pk)
        current = f"staff-revocation-{locked.pk}-{locked.attempts}" == event.event_id
        if locked.status != ScoreRevocation.Status.PROPOSED or not (
                applied or (current and locked.last_outcome == APPROVAL_PENDING)):
            return ApprovalResult(revocation=locked, status=status, detail=locked.last_outcome_detail)
        season = locked.season
        based_on = {"score": locked.score_before, "score_version": locked.base_version}
        # Locked again: taken in _approval_attempt_begin, held still or released with its commit.
        dispute = _dispute_locked(locked.dispute) if locked.dispute_id else None  # type: ignore[arg-type]
        late_result = (_late_result_locked(alias=locked.late_result_alias, late_result_id=locked.late_result_id)
                       if locked.late_result_id else None)
        now = timezone.now()
        locked.last_outcome = status
        if applied:
            locked.status = ScoreRevocation.Status.APPLIED
            locked.decided_by_id, locked.decided_by_label, locked.decided_at = approver_id, actor.label, now
            locked.decision_reason, locked.event_id = reason, event.event_id
            locked.last_outcome_detail = (f"score {locked.score_before} -> {outcome.score} (version "
                                          f"{outcome.score_version}), visible from leaderboard version "
                                          f"{outcome.pending_version}")
        elif status == "stale":
            now_score, now_version = _player_state(season, locked.player_id)
            locked.last_outcome_detail = (
                f"stale: the match service moved {locked.player_id} to version {now_version} (score {now_score}) "
                f"after this proposal was based on version {locked.base_version} (score {locked.score_before}). "
                "Nothing changed. Check that the proposed score is still right, then retry on the current version."
            )
        else:
            locked.last_outcome_detail = f"{status}: {outcome.reason or 'not applied'}; nothing changed"
        locked.save()
        audit_log(actor=actor,
                  action="revocation.approved" if applied else "revocation.approval_failed",
                  target_type="revocation", target_id=str(locked.pk), season_slug=season.slug,
                  before=based_on,
                  after={"outcome": status, "event_id": event.event_id, "score": outcome.score,
                         "score_version": outcome.score_version, "pending_version": outcome.pending_version,
                         "proposed_by": locked.proposed_by_label},
                  reason=reason or locked.reason)
        if applied:
            _revocation_resolves(locked, dispute=dispute, late_result=late_result, actor=actor, now=now)
    return ApprovalResult(revocation=locked, status=status, detail=locked.last_outcome_detail)


def _revocation_resolves(revocation: ScoreRevocation, *, dispute: Dispute | None, late_result: LateResult | None,
                         actor: Actor, now: datetime) -> None:
    """An applied revocation closes the dispute or late result it came from (same transaction;
    the caller holds their locks)."""
    slug = revocation.season.slug
    if dispute is not None:
        dispute.status = Dispute.Status.RESOLVED
        dispute.resolution_reason = f"score revoked to {revocation.new_score} (revocation {revocation.pk})"
        dispute.resolved_by_label, dispute.resolved_at, dispute.updated_at = actor.label, now, now
        dispute.save(update_fields=["status", "resolution_reason", "resolved_by_label", "resolved_at", "updated_at"])
        audit_log(actor=actor, action="dispute.resolved", target_type="dispute", target_id=str(dispute.pk),
                  season_slug=slug, before={"status": Dispute.Status.REVOCATION_PROPOSED},
                  after={"status": dispute.status, "revocation": revocation.pk}, reason=dispute.resolution_reason)
    if late_result is not None:
        _late_result_applied_save(late_result, revocation=revocation, label=actor.label, now=now)
        audit_log(actor=actor, action="late_result.applied", target_type="late_result",
                  target_id=late_result_ref(late_result), season_slug=slug,
                  before={"status": LateResult.Status.PENDING},
                  after={"status": late_result.status, "revocation": revocation.pk, "score": revocation.new_score,
                         "database": late_result_alias_of(late_result)},
                  reason=late_result.resolution_reason)


def score_revocation_reject(*, revocation: ScoreRevocation, actor: Actor, reason: str) -> ScoreRevocation:
    decider_id = _user_id(actor)
    reason = _text(reason, field="a reason")
    with transaction.atomic():
        locked = _revocation_proposed_locked(revocation)
        _approval_not_pending(locked)
        now = timezone.now()
        locked.status = ScoreRevocation.Status.REJECTED
        locked.decided_by_id, locked.decided_by_label, locked.decided_at = decider_id, actor.label, now
        locked.decision_reason = reason
        locked.save(update_fields=["status", "decided_by", "decided_by_label", "decided_at", "decision_reason"])
        if locked.dispute_id:
            # The dispute goes back to the queue: it can be rejected or get another proposal.
            # Updated before the audit row: the audit head is the last lock (_dispute_locked).
            Dispute.objects.filter(pk=locked.dispute_id, status=Dispute.Status.REVOCATION_PROPOSED).update(
                status=Dispute.Status.OPEN, updated_at=now
            )
        audit_log(actor=actor, action="revocation.rejected", target_type="revocation", target_id=str(locked.pk),
                  season_slug=locked.season.slug, before={"status": ScoreRevocation.Status.PROPOSED},
                  after={"status": locked.status}, reason=reason)
    return locked


def _approval_late_result_repair(*, revocation: ScoreRevocation) -> ApprovalResult | None:
    """An approval sent again after its late result's half was lost completes that half
    (exactly once: the revocation and its audit rows are already in "default")."""
    if not revocation.late_result_id or revocation.late_result_alias == DEFAULT_ALIAS:
        return None
    current = ScoreRevocation.objects.select_related("season").get(pk=revocation.pk)
    if current.status != ScoreRevocation.Status.APPLIED:
        return None
    if _late_result_applied_repair(alias=current.late_result_alias, late_result_id=revocation.late_result_id) is None:
        return None
    return ApprovalResult(revocation=current, status=APPLIED, detail=current.last_outcome_detail)
