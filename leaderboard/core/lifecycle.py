"""Season states (docs/rules.md, Season lifecycle): transitions, their guards, and which events a season admits.

    SCHEDULED -> OPEN -> CLOSING -> FINALIZING -> FINAL

Pure: the services in seasons/services.py perform the transitions under the season's
write lock and write the audit rows; this module only says what is allowed and why not.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from leaderboard.core.errors import DomainError
from leaderboard.core.humanize import instant_text
from leaderboard.core.ledger import HELD_AFTER_SEAL


class SeasonState(StrEnum):
    SCHEDULED = "SCHEDULED"
    OPEN = "OPEN"
    CLOSING = "CLOSING"
    FINALIZING = "FINALIZING"
    FINAL = "FINAL"


ACCEPTING_STATES = frozenset({SeasonState.OPEN, SeasonState.CLOSING})
SEALED_STATES = frozenset({SeasonState.FINALIZING, SeasonState.FINAL})
# States whose board can still change, so epochs keep running (FINAL: corrections).
MATERIALIZED_STATES = frozenset({SeasonState.OPEN, SeasonState.CLOSING, SeasonState.FINALIZING, SeasonState.FINAL})

REJECT_AFTER_CUTOFF = "after_cutoff"
REJECT_BEFORE_START = "before_season_start"
REJECT_NOT_OPEN = "season_not_open"
REJECT_NOT_ACCEPTING = "season_not_accepting_results"
# Not a refusal of the result itself: it ended before the cutoff but arrived after the
# seal, so it waits in the late-results queue for staff instead of entering the board.
LATE_AFTER_SEAL = "late_after_seal"

# Audit action codes of the transitions.
TRANSITIONS: dict[tuple[SeasonState, SeasonState], str] = {
    (SeasonState.SCHEDULED, SeasonState.OPEN): "season.opened",
    (SeasonState.OPEN, SeasonState.CLOSING): "season.closing",
    (SeasonState.CLOSING, SeasonState.FINALIZING): "season.ingest.sealed",
    (SeasonState.FINALIZING, SeasonState.FINAL): "season.final.approved",
}


class TransitionError(DomainError):
    code = "transition_refused"


def initial_state(*, starts_at: datetime, cutoff: datetime, now: datetime) -> SeasonState:
    if now < starts_at:
        return SeasonState.SCHEDULED
    if now < cutoff:
        return SeasonState.OPEN
    return SeasonState.CLOSING


def transition_check(*, current: str, target: str, now: datetime, cutoff: datetime) -> str:
    """The audit action code of a legal transition, or TransitionError saying why not."""
    try:
        pair = (SeasonState(current), SeasonState(target))
    except ValueError as exc:
        raise TransitionError(f"unknown state: {exc}") from None
    action = TRANSITIONS.get(pair)
    if action is None:
        allowed = [t.value for (s, t) in TRANSITIONS if s == pair[0]]
        raise TransitionError(
            f"a {current} season cannot become {target}" + (f" (only {', '.join(allowed)})" if allowed else "")
        )
    if pair[1] in (SeasonState.CLOSING, SeasonState.FINALIZING) and now < cutoff:
        raise TransitionError(f"the cutoff, {instant_text(cutoff, now=now)}, has not passed yet")
    return action


def transition_offered(*, state: str, target: str, now: datetime, cutoff: datetime) -> bool:
    """Whether staff can make `target` happen now (what the console offers as a button)."""
    try:
        transition_check(current=state, target=target, now=now, cutoff=cutoff)
    except TransitionError:
        return False
    return True


def due_transition(*, state: str, now: datetime, starts_at: datetime, cutoff: datetime,
                   cutoff_seal_seconds: float | None) -> SeasonState | None:
    """The transition the clock calls for now (Celery beat), if any.

    `cutoff_seal_seconds` is how long after the cutoff ingest is sealed automatically
    (None: only staff seal).
    """
    if state == SeasonState.SCHEDULED and now >= starts_at:
        return SeasonState.OPEN
    if state == SeasonState.OPEN and now >= cutoff:
        return SeasonState.CLOSING
    if (state == SeasonState.CLOSING and cutoff_seal_seconds is not None
            and (now - cutoff).total_seconds() >= cutoff_seal_seconds):
        return SeasonState.FINALIZING
    return None


def admission_rejection(
    *, state: str, starts_at: datetime, cutoff: datetime, completed_at: datetime, kind: str = "result",
    staff_approved: bool = False,
) -> str | None:
    """Why a season does not admit an event into the board now, or None when it does.

    Decided on the trusted completed_at, never on arrival time: a result that ended
    before the cutoff and arrives late is still eligible while ingest is open, and goes
    to the late-results queue (LATE_AFTER_SEAL) once ingest is sealed. Corrections
    (revocations, won disputes) are admitted until the seal; from the seal on, one from
    the write API is held for staff (HELD_AFTER_SEAL), and one that staff approved is
    admitted, also after FINAL: it produces a corrected version and never rewrites the
    FINAL standings.
    """
    if state == SeasonState.SCHEDULED:
        return REJECT_NOT_OPEN
    if completed_at > cutoff:
        return REJECT_AFTER_CUTOFF
    if completed_at < starts_at:
        return REJECT_BEFORE_START
    if kind == "correction":
        return HELD_AFTER_SEAL if state in SEALED_STATES and not staff_approved else None
    if state in SEALED_STATES:
        return LATE_AFTER_SEAL
    if state not in ACCEPTING_STATES:
        return REJECT_NOT_ACCEPTING
    return None


@dataclass(frozen=True, slots=True)
class ApprovalCheck:
    ok: bool
    reason: str = ""


def two_person_refusal(*, proposer_id: int, approver_id: int, approver_granted_by: Collection[int] = ()) -> str | None:
    """Why the approver is not a second person for this proposal, or None.

    Whoever created the approver's account or gave it its role could otherwise make a
    second account and approve their own proposals with it.
    """
    if proposer_id == approver_id:
        return "the proposer cannot approve their own proposal"
    if proposer_id in approver_granted_by:
        return "the proposer granted the approver's role: a third staff member must approve"
    return None


def approval_check(*, proposer_id: int | None, approver_id: int, reconciliation_ok: bool,
                   candidate_version: int, published_version: int,
                   approver_granted_by: Collection[int] = ()) -> ApprovalCheck:
    """The two-person rule and what else must hold before a candidate becomes FINAL."""
    if proposer_id is None:
        return ApprovalCheck(False, "the candidate has not been proposed")
    refusal = two_person_refusal(proposer_id=proposer_id, approver_id=approver_id,
                                 approver_granted_by=approver_granted_by)
    if refusal is not None:
        return ApprovalCheck(False, refusal)
    if not reconciliation_ok:
        return ApprovalCheck(False, "the candidate's reconciliation failed")
    if candidate_version != published_version:
        return ApprovalCheck(False, f"the board moved on (v{published_version}) since candidate v{candidate_version}")
    return ApprovalCheck(True)
