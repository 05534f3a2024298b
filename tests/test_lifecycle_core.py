"""The pure season state machine of docs/rules.md, Season lifecycle (leaderboard/core/lifecycle.py):
transitions and their guards, what the clock calls for, which events a season admits,
and the two-person rule of FINAL approval."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from leaderboard.core.ledger import HELD_AFTER_SEAL
from leaderboard.core.lifecycle import (
    ACCEPTING_STATES,
    LATE_AFTER_SEAL,
    REJECT_AFTER_CUTOFF,
    REJECT_BEFORE_START,
    REJECT_NOT_ACCEPTING,
    REJECT_NOT_OPEN,
    SEALED_STATES,
    TRANSITIONS,
    ApprovalCheck,
    SeasonState,
    TransitionError,
    admission_rejection,
    approval_check,
    due_transition,
    initial_state,
    transition_check,
    transition_offered,
)

S = SeasonState
START = datetime(2026, 11, 1, tzinfo=UTC)
CUTOFF = datetime(2026, 12, 1, tzinfo=UTC)
AFTER = CUTOFF + timedelta(seconds=1)
BEFORE = CUTOFF - timedelta(seconds=1)


# --- states and transitions -------------------------------------------------------------


def test_the_lifecycle_is_one_straight_line_with_an_audit_code_per_step() -> None:
    assert TRANSITIONS == {
        (S.SCHEDULED, S.OPEN): "season.opened",
        (S.OPEN, S.CLOSING): "season.closing",
        (S.CLOSING, S.FINALIZING): "season.ingest.sealed",
        (S.FINALIZING, S.FINAL): "season.final.approved",
    }
    assert [s.value for s in S] == ["SCHEDULED", "OPEN", "CLOSING", "FINALIZING", "FINAL"]
    assert frozenset({S.OPEN, S.CLOSING}) == ACCEPTING_STATES
    assert frozenset({S.FINALIZING, S.FINAL}) == SEALED_STATES


@pytest.mark.parametrize(
    ("now", "state"),
    [
        (START - timedelta(microseconds=1), S.SCHEDULED),
        (START, S.OPEN),
        (BEFORE, S.OPEN),
        (CUTOFF, S.CLOSING),
        (CUTOFF + timedelta(days=400), S.CLOSING),
    ],
)
def test_initial_state_follows_the_clock(now: datetime, state: SeasonState) -> None:
    assert initial_state(starts_at=START, cutoff=CUTOFF, now=now) == state


@pytest.mark.parametrize(
    ("current", "target", "action"),
    [
        ("SCHEDULED", "OPEN", "season.opened"),
        ("OPEN", "CLOSING", "season.closing"),
        ("CLOSING", "FINALIZING", "season.ingest.sealed"),
        ("FINALIZING", "FINAL", "season.final.approved"),
    ],
)
def test_every_legal_transition_after_the_cutoff_returns_its_audit_action(current: str, target: str,
                                                                            action: str) -> None:
    assert transition_check(current=current, target=target, now=AFTER, cutoff=CUTOFF) == action
    # Exactly at the cutoff counts as passed.
    assert transition_check(current=current, target=target, now=CUTOFF, cutoff=CUTOFF) == action


def test_staff_may_open_a_season_before_its_start_and_before_the_cutoff() -> None:
    assert transition_check(current="SCHEDULED", target="OPEN", now=START - timedelta(days=3),
                            cutoff=CUTOFF) == "season.opened"


@pytest.mark.parametrize("target", ["CLOSING", "FINALIZING"])
def test_closing_and_sealing_are_refused_before_the_cutoff(target: str) -> None:
    current = {"CLOSING": "OPEN", "FINALIZING": "CLOSING"}[target]
    with pytest.raises(TransitionError) as excinfo:
        transition_check(current=current, target=target, now=BEFORE, cutoff=CUTOFF)
    # For people: the instant in UTC and how far away it is.
    assert str(excinfo.value) == "the cutoff, 2026-12-01 00:00 UTC (in 1 second), has not passed yet"
    assert not transition_offered(state=current, target=target, now=BEFORE, cutoff=CUTOFF)
    assert transition_offered(state=current, target=target, now=CUTOFF, cutoff=CUTOFF)


def test_approving_final_has_no_clock_guard_beyond_the_seal() -> None:
    # FINALIZING is only reachable after the cutoff; FINAL is not guarded again by it.
    assert transition_check(current="FINALIZING", target="FINAL", now=BEFORE, cutoff=CUTOFF) == (
        "season.final.approved"
    )


ALL = [s.value for s in S]
ILLEGAL = [(a, b) for a in ALL for b in ALL if (S(a), S(b)) not in TRANSITIONS]


@pytest.mark.parametrize(("current", "target"), ILLEGAL)
def test_every_other_pair_of_states_is_refused_with_the_allowed_successor(current: str, target: str) -> None:
    with pytest.raises(TransitionError) as excinfo:
        transition_check(current=current, target=target, now=AFTER, cutoff=CUTOFF)
    successor = {"SCHEDULED": "OPEN", "OPEN": "CLOSING", "CLOSING": "FINALIZING", "FINALIZING": "FINAL"}
    if current in successor:
        assert str(excinfo.value) == f"a {current} season cannot become {target} (only {successor[current]})"
    else:
        assert str(excinfo.value) == f"a FINAL season cannot become {target}"


def test_skipping_a_state_is_refused_even_after_the_cutoff() -> None:
    with pytest.raises(TransitionError, match=r"a OPEN season cannot become FINALIZING \(only CLOSING\)"):
        transition_check(current="OPEN", target="FINALIZING", now=AFTER, cutoff=CUTOFF)
    with pytest.raises(TransitionError, match=r"a CLOSING season cannot become FINAL \(only FINALIZING\)"):
        transition_check(current="CLOSING", target="FINAL", now=AFTER, cutoff=CUTOFF)


@pytest.mark.parametrize(("current", "target"), [("ARCHIVED", "OPEN"), ("OPEN", "closing"), ("", "OPEN")])
def test_unknown_states_are_refused(current: str, target: str) -> None:
    with pytest.raises(TransitionError, match="unknown state"):
        transition_check(current=current, target=target, now=AFTER, cutoff=CUTOFF)


def test_the_illegal_check_comes_before_the_cutoff_guard() -> None:
    with pytest.raises(TransitionError, match="cannot become"):
        transition_check(current="SCHEDULED", target="CLOSING", now=BEFORE, cutoff=CUTOFF)


# --- due_transition: what the clock (Celery beat) does ----------------------------------


def due(state: str, now: datetime, seal_after: float | None = 600.0) -> SeasonState | None:
    return due_transition(state=state, now=now, starts_at=START, cutoff=CUTOFF, cutoff_seal_seconds=seal_after)


def test_a_scheduled_season_opens_at_its_start() -> None:
    assert due("SCHEDULED", START - timedelta(microseconds=1)) is None
    assert due("SCHEDULED", START) == S.OPEN
    assert due("SCHEDULED", START + timedelta(days=1)) == S.OPEN


def test_a_scheduled_season_past_its_cutoff_still_opens_first_one_step_per_tick() -> None:
    assert due("SCHEDULED", CUTOFF + timedelta(days=1)) == S.OPEN


def test_an_open_season_closes_at_its_cutoff() -> None:
    assert due("OPEN", BEFORE) is None
    assert due("OPEN", CUTOFF) == S.CLOSING
    assert due("OPEN", CUTOFF + timedelta(days=2)) == S.CLOSING


def test_a_closing_season_is_sealed_automatically_after_the_configured_delay() -> None:
    assert due("CLOSING", CUTOFF, seal_after=600) is None
    assert due("CLOSING", CUTOFF + timedelta(seconds=599.999), seal_after=600) is None
    assert due("CLOSING", CUTOFF + timedelta(seconds=600), seal_after=600) == S.FINALIZING
    assert due("CLOSING", CUTOFF + timedelta(hours=5), seal_after=600) == S.FINALIZING


def test_a_zero_seal_delay_seals_at_the_cutoff_itself() -> None:
    assert due("CLOSING", BEFORE, seal_after=0) is None
    assert due("CLOSING", CUTOFF, seal_after=0) == S.FINALIZING


def test_without_a_seal_delay_only_staff_seal() -> None:
    assert due("CLOSING", CUTOFF + timedelta(days=365), seal_after=None) is None


@pytest.mark.parametrize("state", ["FINALIZING", "FINAL"])
def test_the_clock_never_moves_a_sealed_season(state: str) -> None:
    for now in (START, CUTOFF, CUTOFF + timedelta(days=365)):
        assert due(state, now, seal_after=0) is None


# --- admission_rejection: which events a season admits ----------------------------------

IN_SEASON = datetime(2026, 11, 15, tzinfo=UTC)
BEFORE_START = START - timedelta(seconds=1)

# (state, kind, completed_at) -> why the board does not admit it now (None: admitted).
MATRIX = {
    # SCHEDULED admits nothing, whatever its kind or time
    ("SCHEDULED", "result", BEFORE_START): REJECT_NOT_OPEN,
    ("SCHEDULED", "result", IN_SEASON): REJECT_NOT_OPEN,
    ("SCHEDULED", "result", AFTER): REJECT_NOT_OPEN,
    ("SCHEDULED", "correction", BEFORE_START): REJECT_NOT_OPEN,
    ("SCHEDULED", "correction", IN_SEASON): REJECT_NOT_OPEN,
    ("SCHEDULED", "correction", AFTER): REJECT_NOT_OPEN,
    # OPEN and CLOSING admit everything inside [start, cutoff]
    ("OPEN", "result", BEFORE_START): REJECT_BEFORE_START,
    ("OPEN", "result", IN_SEASON): None,
    ("OPEN", "result", AFTER): REJECT_AFTER_CUTOFF,
    ("OPEN", "correction", BEFORE_START): REJECT_BEFORE_START,
    ("OPEN", "correction", IN_SEASON): None,
    ("OPEN", "correction", AFTER): REJECT_AFTER_CUTOFF,
    ("CLOSING", "result", BEFORE_START): REJECT_BEFORE_START,
    ("CLOSING", "result", IN_SEASON): None,
    ("CLOSING", "result", AFTER): REJECT_AFTER_CUTOFF,
    ("CLOSING", "correction", BEFORE_START): REJECT_BEFORE_START,
    ("CLOSING", "correction", IN_SEASON): None,
    ("CLOSING", "correction", AFTER): REJECT_AFTER_CUTOFF,
    # sealed: in-season results go to the late queue, corrections are held for staff
    ("FINALIZING", "result", BEFORE_START): REJECT_BEFORE_START,
    ("FINALIZING", "result", IN_SEASON): LATE_AFTER_SEAL,
    ("FINALIZING", "result", AFTER): REJECT_AFTER_CUTOFF,
    ("FINALIZING", "correction", BEFORE_START): REJECT_BEFORE_START,
    ("FINALIZING", "correction", IN_SEASON): HELD_AFTER_SEAL,
    ("FINALIZING", "correction", AFTER): REJECT_AFTER_CUTOFF,
    ("FINAL", "result", BEFORE_START): REJECT_BEFORE_START,
    ("FINAL", "result", IN_SEASON): LATE_AFTER_SEAL,
    ("FINAL", "result", AFTER): REJECT_AFTER_CUTOFF,
    ("FINAL", "correction", BEFORE_START): REJECT_BEFORE_START,
    ("FINAL", "correction", IN_SEASON): HELD_AFTER_SEAL,
    ("FINAL", "correction", AFTER): REJECT_AFTER_CUTOFF,
}


def test_the_matrix_covers_every_state_kind_and_time() -> None:
    assert len(MATRIX) == len(S) * 2 * 3


@pytest.mark.parametrize(("state", "kind", "completed_at"), list(MATRIX))
def test_admission_matrix(state: str, kind: str, completed_at: datetime) -> None:
    assert admission_rejection(state=state, starts_at=START, cutoff=CUTOFF, completed_at=completed_at,
                               kind=kind) == MATRIX[(state, kind, completed_at)]


@pytest.mark.parametrize("state", ["FINALIZING", "FINAL"])
def test_after_the_seal_only_a_staff_approved_correction_is_admitted(state: str) -> None:
    def admit(kind: str, staff_approved: bool) -> str | None:
        return admission_rejection(state=state, starts_at=START, cutoff=CUTOFF, completed_at=IN_SEASON, kind=kind,
                                   staff_approved=staff_approved)

    assert admit("correction", False) == HELD_AFTER_SEAL
    assert admit("correction", True) is None
    # Staff approval is for corrections: a late result still waits in the queue.
    assert admit("result", True) == LATE_AFTER_SEAL


@pytest.mark.parametrize("state", ["OPEN", "CLOSING", "FINALIZING", "FINAL"])
def test_the_season_bounds_are_inclusive(state: str) -> None:
    expected = LATE_AFTER_SEAL if state in ("FINALIZING", "FINAL") else None
    for moment in (START, CUTOFF):
        assert admission_rejection(state=state, starts_at=START, cutoff=CUTOFF, completed_at=moment) == expected
    assert admission_rejection(state=state, starts_at=START, cutoff=CUTOFF,
                               completed_at=CUTOFF + timedelta(microseconds=1)) == REJECT_AFTER_CUTOFF
    assert admission_rejection(state=state, starts_at=START, cutoff=CUTOFF,
                               completed_at=START - timedelta(microseconds=1)) == REJECT_BEFORE_START


def test_admission_is_decided_on_completed_at_whatever_the_offset() -> None:
    just_before = (CUTOFF - timedelta(seconds=1)).astimezone(timezone(timedelta(hours=-8)))
    assert admission_rejection(state="CLOSING", starts_at=START, cutoff=CUTOFF, completed_at=just_before) is None


def test_the_default_kind_is_a_result() -> None:
    assert admission_rejection(state="FINALIZING", starts_at=START, cutoff=CUTOFF,
                               completed_at=IN_SEASON) == LATE_AFTER_SEAL


def test_a_state_that_is_neither_accepting_nor_sealed_admits_no_result() -> None:
    assert admission_rejection(state="ARCHIVED", starts_at=START, cutoff=CUTOFF,
                               completed_at=IN_SEASON) == REJECT_NOT_ACCEPTING


# --- approval_check: the two-person rule ------------------------------------------------


def approve(**overrides: object) -> ApprovalCheck:
    params: dict[str, object] = {"proposer_id": 1, "approver_id": 2, "reconciliation_ok": True,
                                 "candidate_version": 7, "published_version": 7}
    params.update(overrides)
    return approval_check(**params)  # type: ignore[arg-type]


def test_a_reconciled_proposed_current_candidate_approved_by_another_person_passes() -> None:
    assert approve() == ApprovalCheck(True, "")


def test_an_unproposed_candidate_cannot_be_approved() -> None:
    assert approve(proposer_id=None) == ApprovalCheck(False, "the candidate has not been proposed")


def test_the_proposer_cannot_approve_their_own_proposal() -> None:
    assert approve(proposer_id=5, approver_id=5) == ApprovalCheck(
        False, "the proposer cannot approve their own proposal"
    )


def test_a_failed_reconciliation_blocks_approval() -> None:
    assert approve(reconciliation_ok=False) == ApprovalCheck(False, "the candidate's reconciliation failed")


def test_a_candidate_the_board_moved_past_cannot_be_approved() -> None:
    assert approve(candidate_version=7, published_version=9) == ApprovalCheck(
        False, "the board moved on (v9) since candidate v7"
    )


def test_the_checks_are_reported_in_order_of_who_before_what() -> None:
    # Everything wrong at once: the missing proposal is what is reported.
    assert approve(proposer_id=None, approver_id=1, reconciliation_ok=False, published_version=8).reason == (
        "the candidate has not been proposed"
    )
    # The same person, a failed reconciliation and a moved board: the person is reported.
    assert approve(proposer_id=2, approver_id=2, reconciliation_ok=False, published_version=8).reason == (
        "the proposer cannot approve their own proposal"
    )
    assert approve(reconciliation_ok=False, published_version=8).reason == "the candidate's reconciliation failed"
