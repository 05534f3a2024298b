"""batch_plan: the pure ledger rules of docs/rules.md (Writes: per-event outcomes), checked by example and against the
brute-force reference model (tests/support/reference.py) over random interleavings and batch splits."""

from __future__ import annotations

import copy
from dataclasses import asdict
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from leaderboard.core.events import ScoreEvent
from leaderboard.core.ledger import (
    APPLIED,
    CONFLICT,
    DUPLICATE,
    HELD,
    HELD_REVOKED,
    REJECTED,
    STALE,
    UNCHANGED,
    BatchPlan,
    Change,
    Counted,
    LedgerRow,
    PlayerState,
    RecordedEvent,
    batch_plan,
)
from tests.support.reference import (
    Script,
    as_score_event,
    event_scripts,
    reference_run,
    season_rejection,
    sum_event_scripts,
)

START = datetime(2026, 11, 1, tzinfo=UTC)
CUTOFF = datetime(2026, 12, 1, tzinfo=UTC)
IN_SEASON = datetime(2026, 11, 15, 12, tzinfo=UTC)


def ev(
    event_id: str,
    player_id: str = "alice",
    best_score: int = 100,
    score_version: int = 1,
    *,
    kind: str = "result",
    reason: str = "",
    completed_at: datetime = IN_SEASON,
    match_id: str = "m1",
) -> ScoreEvent:
    return ScoreEvent(
        event_id=event_id, match_id=match_id, player_id=player_id, best_score=best_score,
        score_version=score_version, completed_at=completed_at, kind=kind, reason=reason,
    )


def never(event: ScoreEvent) -> str | None:
    return None


def plan_of(
    events: list[ScoreEvent],
    *,
    recorded: dict[str, RecordedEvent] | None = None,
    current: dict[str, PlayerState] | None = None,
    rejection: Any = never,
    pending_version: int = 1,
) -> BatchPlan:
    return batch_plan(
        events=events, recorded=recorded or {}, current=current or {}, rejection=rejection,
        pending_version=pending_version,
    )


def statuses(plan: BatchPlan) -> list[str]:
    return [o.status for o in plan.outcomes]


# --- results -------------------------------------------------------------------------


def test_first_result_of_a_player_is_applied_with_pending_version() -> None:
    plan = plan_of([ev("e1", best_score=250, score_version=3)], pending_version=8)
    (outcome,) = plan.outcomes
    assert outcome.as_dict() == {
        "event_id": "e1", "status": APPLIED, "player_id": "alice", "score": 250,
        "score_version": 3, "pending_version": 8,
    }
    assert plan.player_states == {"alice": PlayerState(score=250, score_version=3)}
    assert plan.changes == [Change("alice", None, 250, 3, "e1")]
    assert [(r.status, r.score, r.score_version, r.pending_version) for r in plan.ledger_rows] == [
        (APPLIED, 250, 3, 8)
    ]


def test_result_with_higher_score_and_version_raises_the_score() -> None:
    plan = plan_of(
        [ev("e2", best_score=300, score_version=2)],
        current={"alice": PlayerState(200, 1)},
    )
    assert statuses(plan) == [APPLIED]
    assert plan.player_states == {"alice": PlayerState(300, 2)}
    assert plan.changes == [Change("alice", 200, 300, 2, "e2")]


def test_result_with_lower_best_keeps_the_max_and_is_unchanged_but_advances_version() -> None:
    plan = plan_of(
        [ev("e2", best_score=150, score_version=5)],
        current={"alice": PlayerState(200, 1)},
        pending_version=4,
    )
    (outcome,) = plan.outcomes
    assert (outcome.status, outcome.score, outcome.score_version, outcome.pending_version) == (
        UNCHANGED, 200, 5, None,
    )
    assert plan.player_states == {"alice": PlayerState(200, 5)}
    assert plan.changes == []
    assert [r.status for r in plan.ledger_rows] == [UNCHANGED]


def test_a_latest_season_takes_a_newer_lower_result_and_keeps_when_an_equal_one_was_reached() -> None:
    before = PlayerState(200, 1, reached_at=datetime(2026, 1, 1, tzinfo=UTC))
    lower = batch_plan(events=[ev("e2", best_score=150, score_version=2)], recorded={},
                       current={"alice": before}, rejection=never, pending_version=4, latest=True)
    (outcome,) = lower.outcomes
    assert (outcome.status, outcome.score, outcome.score_version, outcome.pending_version) == (APPLIED, 150, 2, 4)
    assert lower.changes == [Change("alice", 200, 150, 2, "e2")]
    assert lower.player_states["alice"].reached_at != before.reached_at
    equal = batch_plan(events=[ev("e3", best_score=200, score_version=2)], recorded={},
                       current={"alice": before}, rejection=never, pending_version=4, latest=True)
    assert statuses(equal) == [UNCHANGED] and equal.changes == []
    assert equal.player_states["alice"].reached_at == before.reached_at
    stale = batch_plan(events=[ev("e4", best_score=10, score_version=1)], recorded={},
                       current={"alice": before}, rejection=never, pending_version=4, latest=True)
    assert statuses(stale) == [STALE] and stale.changes == []


def test_result_with_equal_score_is_unchanged() -> None:
    plan = plan_of([ev("e2", best_score=200, score_version=2)], current={"alice": PlayerState(200, 1)})
    assert statuses(plan) == [UNCHANGED]
    assert plan.changes == []


# --- corrections ---------------------------------------------------------------------


def test_correction_lowers_the_score() -> None:
    plan = plan_of(
        [ev("c1", best_score=10, score_version=2, kind="correction", reason="cheating")],
        current={"alice": PlayerState(900, 1)},
        pending_version=3,
    )
    (outcome,) = plan.outcomes
    assert (outcome.status, outcome.score, outcome.score_version, outcome.pending_version) == (
        APPLIED, 10, 2, 3,
    )
    assert plan.player_states == {"alice": PlayerState(10, 2)}
    assert plan.changes == [Change("alice", 900, 10, 2, "c1")]


def test_correction_to_the_same_score_is_applied_without_a_change() -> None:
    plan = plan_of(
        [ev("c1", best_score=900, score_version=2, kind="correction", reason="re-check")],
        current={"alice": PlayerState(900, 1)},
    )
    (outcome,) = plan.outcomes
    assert (outcome.status, outcome.score, outcome.score_version, outcome.pending_version) == (
        APPLIED, 900, 2, None,
    )
    assert plan.player_states == {"alice": PlayerState(900, 2)}
    assert plan.changes == []


def test_stale_correction_does_not_lower_the_score() -> None:
    plan = plan_of(
        [ev("c1", best_score=10, score_version=1, kind="correction", reason="late")],
        current={"alice": PlayerState(900, 1)},
    )
    assert statuses(plan) == [STALE]
    assert plan.player_states == {}
    assert plan.changes == []


# --- stale / rejected ----------------------------------------------------------------


def test_equal_or_lower_version_is_stale_and_recorded() -> None:
    plan = plan_of(
        [ev("e1", best_score=999, score_version=4), ev("e2", best_score=999, score_version=3)],
        current={"alice": PlayerState(100, 4)},
    )
    assert [o.as_dict() for o in plan.outcomes] == [
        {"event_id": "e1", "status": STALE, "reason": "score_version_not_newer", "player_id": "alice",
         "score": 100, "score_version": 4, "pending_version": None},
        {"event_id": "e2", "status": STALE, "reason": "score_version_not_newer", "player_id": "alice",
         "score": 100, "score_version": 4, "pending_version": None},
    ]
    assert [r.event.event_id for r in plan.ledger_rows] == ["e1", "e2"]
    assert plan.player_states == {}


def test_rejection_callback_rejects_and_records_with_its_reason() -> None:
    def rejection(event: ScoreEvent) -> str | None:
        return "after_cutoff" if event.completed_at > CUTOFF else None

    late = ev("e1", best_score=500, score_version=9, completed_at=CUTOFF + timedelta(seconds=1))
    plan = plan_of([late], current={"alice": PlayerState(100, 1)}, rejection=rejection)
    assert [o.as_dict() for o in plan.outcomes] == [
        {"event_id": "e1", "status": REJECTED, "reason": "after_cutoff", "player_id": "alice",
         "score": 100, "score_version": 1, "pending_version": None},
    ]
    assert [(r.status, r.reason) for r in plan.ledger_rows] == [(REJECTED, "after_cutoff")]
    assert plan.player_states == {}
    assert plan.changes == []


def test_rejected_event_of_unknown_player_reports_no_score() -> None:
    plan = plan_of([ev("e1", player_id="bob")], rejection=lambda e: "season_not_open")
    (outcome,) = plan.outcomes
    assert (outcome.status, outcome.reason, outcome.score, outcome.score_version) == (
        REJECTED, "season_not_open", None, None,
    )


# --- duplicates / conflicts ----------------------------------------------------------


def test_duplicate_of_recorded_event_answers_the_first_outcome() -> None:
    first = ev("e1", best_score=300, score_version=2)
    recorded = {
        "e1": RecordedEvent(
            payload_hash=first.payload_hash(), status=APPLIED, reason="", player_id="alice",
            score=300, score_version=2, pending_version=5,
        )
    }
    plan = plan_of([first], recorded=recorded, current={"alice": PlayerState(300, 2)}, pending_version=9)
    assert [o.as_dict() for o in plan.outcomes] == [
        {"event_id": "e1", "status": DUPLICATE, "first_status": APPLIED, "player_id": "alice",
         "score": 300, "score_version": 2, "pending_version": 5},
    ]
    assert plan.ledger_rows == []
    assert plan.player_states == {}
    assert plan.conflicts == []


def test_same_instant_in_another_offset_is_the_same_payload() -> None:
    utc = ev("e1", completed_at=datetime(2026, 11, 15, 10, tzinfo=UTC))
    plus2 = ev("e1", completed_at=datetime(2026, 11, 15, 12, tzinfo=timezone(timedelta(hours=2))))
    assert utc.payload_hash() == plus2.payload_hash()
    plan = plan_of([utc, plus2])
    assert statuses(plan) == [APPLIED, DUPLICATE]


def test_duplicate_within_one_batch_reports_first_status_of_the_earlier_event() -> None:
    plan = plan_of(
        [ev("e1", score_version=1), ev("e2", score_version=1), ev("e2", score_version=1)],
    )
    assert statuses(plan) == [APPLIED, STALE, DUPLICATE]
    assert plan.outcomes[2].first_status == STALE
    assert plan.outcomes[2].reason == "score_version_not_newer"
    assert [r.event.event_id for r in plan.ledger_rows] == ["e1", "e2"]


def test_conflicting_retry_writes_nothing_but_a_conflict() -> None:
    first = ev("e1", best_score=300)
    recorded = {
        "e1": RecordedEvent(first.payload_hash(), APPLIED, "", "alice", 300, 1, 1),
    }
    retry = ev("e1", best_score=301)
    plan = plan_of([retry], recorded=recorded, current={"alice": PlayerState(300, 1)})
    assert [o.as_dict() for o in plan.outcomes] == [
        {"event_id": "e1", "status": CONFLICT, "reason": "event_id_reused_with_different_payload",
         "player_id": "alice", "score": None, "score_version": None, "pending_version": None},
    ]
    assert plan.conflicts == [(retry, retry.payload_hash())]
    assert plan.ledger_rows == []
    assert plan.player_states == {}
    assert plan.changes == []


def test_retry_after_a_conflict_with_the_original_payload_is_still_a_duplicate() -> None:
    original = ev("e1", best_score=300)
    plan = plan_of([original, ev("e1", best_score=1), original])
    assert statuses(plan) == [APPLIED, CONFLICT, DUPLICATE]


# --- batches -------------------------------------------------------------------------


def test_batch_events_take_effect_in_order_and_changes_chain() -> None:
    plan = plan_of(
        [
            ev("e1", best_score=100, score_version=1),
            ev("e2", best_score=500, score_version=2),
            ev("e3", best_score=50, score_version=3, kind="correction", reason="revoked"),
            ev("e4", best_score=70, score_version=4),
            ev("e5", player_id="bob", best_score=1, score_version=1),
        ],
        pending_version=2,
    )
    assert statuses(plan) == [APPLIED, APPLIED, APPLIED, APPLIED, APPLIED]
    assert [o.score for o in plan.outcomes] == [100, 500, 50, 70, 1]
    assert plan.changes == [
        Change("alice", None, 100, 1, "e1"),
        Change("alice", 100, 500, 2, "e2"),
        Change("alice", 500, 50, 3, "e3"),
        Change("alice", 50, 70, 4, "e4"),
        Change("bob", None, 1, 1, "e5"),
    ]
    # one final state per player, whatever the number of its events
    assert plan.player_states == {"alice": PlayerState(70, 4), "bob": PlayerState(1, 1)}


def test_inputs_are_not_mutated() -> None:
    recorded = {"old": RecordedEvent("h", APPLIED, "", "alice", 1, 1, 1)}
    current = {"alice": PlayerState(1, 1)}
    snapshot = (copy.deepcopy(recorded), copy.deepcopy(current))
    plan_of([ev("e1", score_version=2), ev("e2", player_id="bob")], recorded=recorded, current=current)
    assert (recorded, current) == snapshot


# --- staff revocations that stick ------------------------------------------------------


def test_a_staff_revocation_holds_later_results_above_it_until_the_match_service_corrects() -> None:
    revoked = batch_plan(events=[ev("staff-1", best_score=711, score_version=6, kind="correction", reason="cheat")],
                         recorded={}, current={"alice": PlayerState(975, 5)}, rejection=never, pending_version=3,
                         staff=True)
    assert statuses(revoked) == [APPLIED] and revoked.player_states["alice"].revoked_to == 711
    state = revoked.player_states
    # The match service's next result still counts the revoked match: held, nothing changes.
    above = plan_of([ev("e7", best_score=979, score_version=7)], current=state)
    (held,) = above.outcomes
    assert (held.status, held.reason, held.score, held.score_version, held.pending_version) == (
        HELD, HELD_REVOKED, 711, 6, None)
    assert above.player_states == {} and above.changes == []
    assert [(r.status, r.reason) for r in above.ledger_rows] == [(HELD, HELD_REVOKED)]
    # A result at or below the revoked score is an ordinary unchanged one: the hold stays.
    below = plan_of([ev("e8", best_score=700, score_version=8)], current=state)
    assert statuses(below) == [UNCHANGED] and below.player_states["alice"].revoked_to == 711
    # Its correction acknowledges the revocation; its results count again.
    acknowledged = plan_of([ev("e9", best_score=711, score_version=9, kind="correction", reason="ack"),
                            ev("e10", best_score=800, score_version=10)], current=state)
    assert statuses(acknowledged) == [APPLIED, APPLIED]
    assert acknowledged.player_states["alice"] == PlayerState(800, 10)
    assert acknowledged.player_states["alice"].revoked_to is None


def test_a_staff_correction_that_raises_a_score_holds_nothing_unless_a_revocation_stands() -> None:
    raised = batch_plan(events=[ev("staff-1", best_score=900, score_version=2, kind="correction", reason="dispute")],
                        recorded={}, current={"alice": PlayerState(500, 1)}, rejection=never, pending_version=1,
                        staff=True)
    assert raised.player_states["alice"].revoked_to is None
    standing = batch_plan(events=[ev("staff-2", best_score=800, score_version=7, kind="correction", reason="review")],
                          recorded={}, current={"alice": PlayerState(700, 6, revoked_to=700)}, rejection=never,
                          pending_version=1, staff=True)
    assert standing.player_states["alice"].revoked_to == 800


# --- property: batch_plan over random batch splits == the sequential reference model --


PlanRun = tuple[list[dict[str, Any]], dict[str, tuple[int, int]], list[tuple[Any, ...]], list[str], dict[str, int]]


def plan_run(script: Script, rejection: Any, *, latest: bool = False, summed: bool = False,
             ascending: bool = False, max_score: int | None = None) -> PlanRun:
    """Drive batch_plan the way ledger_store does: per batch, hand it only the recorded
    events, player states and (a sum season) corrected results the batch refers to, then
    persist what the plan decided."""
    rows: list[LedgerRow] = []
    recorded: dict[str, RecordedEvent] = {}
    states: dict[str, PlayerState] = {}
    outcomes: list[dict[str, Any]] = []
    changes: list[tuple[Any, ...]] = []
    conflicts: list[str] = []
    for i, (raw_batch, published) in enumerate(zip(script.batches, script.published, strict=True)):
        events = [as_score_event(e) for e in raw_batch]
        ids = {e.event_id for e in events}
        players = {e.player_id for e in events}
        plan = batch_plan(
            events=events,
            recorded={k: v for k, v in recorded.items() if k in ids},
            current={k: v for k, v in states.items() if k in players},
            rejection=lambda e: rejection(asdict(e)),
            pending_version=published + 1,
            staff=script.staff_of(i),
            latest=latest,
            summed=summed,
            counted=counted_of(rows, {e.corrects for e in events if e.corrects is not None}),
            ascending=ascending,
            max_score=max_score,
        )
        rows.extend(plan.ledger_rows)
        outcomes.extend(o.as_dict() for o in plan.outcomes)
        row_ids = [r.event.event_id for r in plan.ledger_rows]
        assert len(row_ids) == len(set(row_ids)), "an event id recorded twice in one batch"
        assert not set(row_ids) & set(recorded), "an event id recorded again"
        for row in plan.ledger_rows:
            recorded[row.event.event_id] = RecordedEvent(
                payload_hash=row.payload_hash, status=row.status, reason=row.reason,
                player_id=row.event.player_id, score=row.score, score_version=row.score_version,
                pending_version=row.pending_version,
            )
        states.update(plan.player_states)
        changes.extend(
            (c.player_id, c.old_score, c.new_score, c.score_version, c.event_id) for c in plan.changes
        )
        conflicts.extend(event.event_id for event, _ in plan.conflicts)
    final = {player: (s.score, s.score_version) for player, s in states.items()}
    revoked = {player: s.revoked_to for player, s in states.items() if s.revoked_to is not None}
    return outcomes, final, changes, conflicts, revoked


def counted_of(rows: list[LedgerRow], targets: set[str]) -> dict[str, Counted]:
    """What ledger_store.counted_points_fetch reads from the ledger rows written so far."""
    counted = {r.event.event_id: Counted(r.event.player_id, r.event.points or 0, 0) for r in rows
               if r.event.event_id in targets and r.event.kind == "result" and r.status in (APPLIED, UNCHANGED)}
    for r in rows:
        if r.event.kind == "correction" and r.status == APPLIED and r.event.corrects in counted:
            mine = counted[r.event.corrects]
            if r.event.score_version > mine.version:
                counted[r.event.corrects] = Counted(mine.player_id, r.event.points or 0, r.event.score_version)
    return counted


@settings(max_examples=300, deadline=None)
@given(script=sum_event_scripts(starts_at=START, cutoff=CUTOFF, max_events=40),
       max_score=st.sampled_from((15, 1_000_000)))
def test_sum_batch_plan_matches_the_sequential_reference_model(script: Script, max_score: int) -> None:
    """A sum season: points added, corrections amending one result in any order and
    version, unknown targets, ranges left (a narrow one and the default), exact and
    conflicting resends."""
    rejection = season_rejection(starts_at=START, cutoff=CUTOFF)
    model, expected_outcomes = reference_run(script, rejection, summed=True, max_score=max_score)
    outcomes, final, changes, conflicts, _ = plan_run(script, rejection, summed=True, max_score=max_score)
    assert outcomes == expected_outcomes
    assert final == model.players
    assert changes == model.changes
    assert conflicts == model.conflicts
    # A sum is the sum of the points its player's accepted results count now (unless
    # staff set it).
    sums: dict[str, int] = {}
    for player, points, _ in model.counted.values():
        sums[player] = sums.get(player, 0) + points
    set_players = {e["player_id"] for e in script.events if e.get("kind") == "correction" and "corrects" not in e}
    for player, (score, _) in final.items():
        if player not in set_players:
            assert score == sums.get(player, 0)


@settings(max_examples=300, deadline=None)
@given(script=event_scripts(starts_at=START, cutoff=CUTOFF, max_events=40, with_staff=True),
       latest=st.booleans(), ascending=st.booleans())
def test_batch_plan_matches_sequential_reference_model(script: Script, latest: bool, ascending: bool) -> None:
    """In a `best` season and in a `latest` one, of either order."""
    rejection = season_rejection(starts_at=START, cutoff=CUTOFF)
    model, expected_outcomes = reference_run(script, rejection, latest=latest, ascending=ascending)
    outcomes, final, changes, conflicts, revoked = plan_run(script, rejection, latest=latest, ascending=ascending)
    assert outcomes == expected_outcomes
    assert final == model.players
    assert changes == model.changes
    assert conflicts == model.conflicts
    assert revoked == model.revoked


@settings(max_examples=100, deadline=None)
@given(script=event_scripts(starts_at=START, cutoff=CUTOFF))
def test_batch_split_does_not_change_the_result(script: Script) -> None:
    """The same events as one batch or as one batch per event decide the same outcomes."""
    rejection = season_rejection(starts_at=START, cutoff=CUTOFF)
    version = script.published[0]
    whole = Script(batches=[script.events], published=[version])
    singles = Script(batches=[[e] for e in script.events], published=[version] * len(script.events))
    assert plan_run(whole, rejection) == plan_run(singles, rejection)
