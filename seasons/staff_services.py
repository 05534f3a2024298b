"""Writes of the staff console: staff accounts and roles, disputes, two-person score
revocations, the late-results queue, and reconciliation runs on demand.

Each service is one transaction holding its audit row (audit.services.audit_log), so an
action and its record commit or vanish together. Roles are enforced by the views
(permissions); the rules that must hold whoever calls (the two-person rule, the states
an object may move between) are enforced here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit.models import AuditEntry
from audit.selectors import staff_role_granters
from audit.services import Actor, audit_log
from leaderboard.core.errors import DomainError
from leaderboard.core.events import (
    KIND_CORRECTION,
    MAX_REASON_LENGTH,
    MAX_SCORE,
    MIN_SCORE,
    ScoreEvent,
    check_int,
    check_player_id,
)
from leaderboard.core.ledger import APPLIED, DUPLICATE, Outcome
from leaderboard.core.lifecycle import two_person_refusal
from leaderboard.ingest.services import score_events_apply
from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_aliases, ledger_atomic
from leaderboard.ledger_reads import ledger_queryset_of_player
from leaderboard.models import LateResult, PlayerScore, ReconciliationRun
from leaderboard.ratelimit import rate_take, request_address
from leaderboard.recovery.reconcile import reconciliation_run
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_OUTAGES
from seasons.models import Dispute, DisputeNote, ScoreRevocation, Season, StaffConsole

log = logging.getLogger(__name__)
User = get_user_model()

# Role -> the StaffConsole permissions its group holds. Each role includes the one before:
# an approver can also propose, but never approve their own proposal.
VIEWER = ("console_view",)
REVIEWER = VIEWER + ("disputes_manage", "revocation_propose", "late_results_dismiss", "views_operate",
                     "final_propose")
APPROVER = REVIEWER + ("revocation_approve", "split_publish", "final_approve", "season_transition")
ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {"viewer": VIEWER, "reviewer": REVIEWER, "approver": APPROVER}
ROLES = tuple(ROLE_PERMISSIONS)


class StaffError(DomainError):
    """An action the rules refuse; the message is shown to the staff member as is."""

    code = "action_refused"


def perm(codename: str) -> str:
    """The full permission name the views check, e.g. perm("final_approve")."""
    return f"seasons.{codename}"


def staff_actor(user: AbstractBaseUser | AnonymousUser) -> Actor:
    return Actor(kind="user", id=str(user.pk), label=user.get_username())


def _user_id(actor: Actor) -> int:
    if actor.kind != "user" or not actor.id:
        raise StaffError("only a signed-in staff member can do this")
    return int(actor.id)


def _text(value: str, *, field: str, required: bool = True, limit: int | None = None) -> str:
    value = value.strip()
    if required and not value:
        raise StaffError(f"{field} is required")
    if limit is not None and len(value) > limit:
        raise StaffError(f"{field} must be at most {limit} characters")
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL.
        raise StaffError(f"{field} must not contain NUL characters")
    return value


def _score(value: int, *, field: str = "score") -> int:
    problem = check_int(value, low=MIN_SCORE, high=MAX_SCORE)
    if problem:
        raise StaffError(f"{field}: {problem}")
    return value


def _player(player_id: str) -> str:
    problem = check_player_id(player_id)
    if problem:
        raise StaffError(f"player id {problem}")
    return player_id


# ------------------------------------------------------------------ staff and roles


def staff_roles_ensure() -> dict[str, Group]:
    """Create (or repair) the role groups and their permissions; idempotent."""
    content_type = ContentType.objects.get_for_model(StaffConsole, for_concrete_model=False)
    names = dict(StaffConsole._meta.permissions)
    permissions = {
        codename: Permission.objects.get_or_create(content_type=content_type, codename=codename,
                                                   defaults={"name": names[codename]})[0]
        for codename in names
    }
    groups = {}
    for role, codenames in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set([permissions[c] for c in codenames])
        groups[role] = group
    return groups


def staff_role_of(user: Any) -> str | None:
    """The highest role the user's groups give. Being a Django superuser gives none: a
    superuser could make a second account, and the two-person rule would count two people."""
    if not getattr(user, "is_authenticated", False):
        return None
    names = set(user.groups.values_list("name", flat=True))
    return next((role for role in reversed(ROLES) if role in names), None)


def staff_user_create(*, username: str, role: str, password: str, actor: Actor) -> tuple[Any, bool]:
    """Create a staff account with one role, or give an existing account that role (and password)."""
    if role not in ROLE_PERMISSIONS:
        raise StaffError(f"role must be one of {', '.join(ROLES)}")
    username = _text(username, field="username", limit=150)
    if not password:
        raise StaffError("a password is required")
    with transaction.atomic():
        groups = staff_roles_ensure()
        # Any: the configured user model; the console needs groups (PermissionsMixin).
        user: Any
        user, created = User.objects.get_or_create(username=username)
        before = None if created else {"role": staff_role_of(user)}
        user.set_password(password)
        user.save()
        user.groups.remove(*[g for name, g in groups.items() if name != role])
        user.groups.add(groups[role])
        audit_log(actor=actor, action="staff.user.created" if created else "staff.user.updated",
                  target_type="user", target_id=str(user.pk), before=before,
                  after={"username": username, "role": role})
    return user, created


def _client_address(request: Any) -> str:
    return request_address(request.META) if request is not None and hasattr(request, "META") else ""


def staff_login_audit(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """Signal receiver (user_logged_in): one audit row per sign-in."""
    audit_log(actor=staff_actor(user), action="auth.login", target_type="user", target_id=str(user.pk),
              after={"role": staff_role_of(user), "address": _client_address(request)})


def staff_logout_audit(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None:
        return  # the session had expired: nobody to name
    audit_log(actor=staff_actor(user), action="auth.logout", target_type="user", target_id=str(user.pk))


# Failed sign-ins are counted per hour, address and user name in Redis, kept a week.
LOGIN_FAILURES_KEEP_SECONDS = 7 * 86_400


def login_failures_key(hour: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:auth:failed:{hour}"


_COUNTER_UNREACHABLE: tuple[type[Exception], ...] = (*REDIS_OUTAGES, OSError)


def staff_login_failed_count(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    """Signal receiver (user_login_failed): counted, not audited.

    Anyone can fail a sign-in, as often as the login throttle lets them: a chained audit
    row each (under the chain's one lock) would let anonymous traffic grow the trail and
    stall every staff action. What is security-relevant, a throttled address or user
    name, is audited once per window (staff_login_attempt_check); successful sign-ins
    are audited. Django has already masked the password; the user name tried is kept.
    """
    username = str(credentials.get("username", ""))[:150]
    address = _client_address(request)
    key = login_failures_key(int(time.time()) // 3600)
    try:
        with redis_get().pipeline(transaction=False) as pipe:
            pipe.hincrby(key, f"{address}|{username}", 1)
            pipe.expire(key, LOGIN_FAILURES_KEEP_SECONDS)
            pipe.execute()
    except _COUNTER_UNREACHABLE:
        log.warning("failed sign-in of %r from %s not counted: Redis unreachable", username, address)


def staff_login_attempt_check(*, address: str, username: str) -> float:
    """One sign-in attempt from `address` for `username`: 0.0 to go ahead, else the seconds
    to wait (LOGIN_RATE_LIMIT, per address and per user name).

    The first refusal of a window is audited (`auth.login.throttled`): someone is guessing
    passwords. Later refusals in the same window are not, so a flood writes one row.
    """
    rate = settings.LOGIN_RATE_LIMIT
    if rate is None:
        return 0.0
    per_second, size = rate
    name = username.strip().lower()[:150]
    waits = {"address": rate_take(kind="login-address", name=address, rate=rate),
             "username": rate_take(kind="login-user", name=name, rate=rate)}
    blocked = {by: wait for by, wait in waits.items() if wait}
    if not blocked:
        return 0.0
    window = (1 / (size / per_second), 1)  # one audit row per bucket's refill time
    for by in blocked:
        if not rate_take(kind="login-throttle-audited", name=f"{by}:{address if by == 'address' else name}",
                         rate=window):
            audit_log(actor=Actor(kind="anonymous", id="", label=username[:150] or "(no username)"),
                      action="auth.login.throttled", target_type="user", target_id=name,
                      after={"address": address, "by": by, "limit": f"{size} per {size / per_second:.0f} s"})
    return max(blocked.values())


# ------------------------------------------------------------------------- disputes


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
        _score(claimed_score, field="claimed score")
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
    # Lock order, in every service of this module: the revocation row, then its dispute,
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


# ---------------------------------------------------------------- score revocations


def _player_state(season: Season, player_id: str) -> tuple[int | None, int]:
    row = ledger_queryset_of_player(
        season=season, player_id=player_id,
        queryset=PlayerScore.objects.filter(season=season, player_id=player_id).values_list("score", "score_version"),
    ).first()
    return (row[0], int(row[1])) if row is not None else (None, 0)


def score_revocation_propose(
    *, season: Season, player_id: str, new_score: int, reason: str, actor: Actor, evidence: str = "",
    public_reason: str = "", dispute: Dispute | None = None, late_result: LateResult | None = None,
) -> ScoreRevocation:
    """Propose a corrected absolute score, based on the player's current score and version."""
    proposer_id = _user_id(actor)
    player_id = _player(player_id)
    _score(new_score, field="new score")
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


# ---------------------------------------------------------------------- late results


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


def late_result_proposal_score(*, late_result: LateResult) -> int:
    """What applying a queued event means: for a late result, the player's best as if it
    had arrived in time; for a held correction, the score it sets (even when lower)."""
    if late_result.ledger_event.kind == KIND_CORRECTION:
        return late_result.best_score
    # The season from "default": the late result's database holds no Season rows.
    current, _ = _player_state(Season.objects.get(pk=late_result.season_id), late_result.player_id)
    return max(current or 0, late_result.best_score)


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


# ------------------------------------------------------------------- reconciliation


def reconciliation_trigger(*, season: Season, actor: Actor) -> ReconciliationRun:
    """Run a reconciliation now; the run row and its audit row commit together."""
    with transaction.atomic():
        run = reconciliation_run(season=season)
        failed = [f["check"] for f in run.findings if not f["ok"]]
        audit_log(actor=actor, action="views.reconciliation.run", target_type="reconciliation_run",
                  target_id=str(run.pk), season_slug=season.slug,
                  after={"version": run.version, "ok": run.ok, "mode": run.mode, "failed_checks": failed})
    return run
