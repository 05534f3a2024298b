"""Pure tests of first-to-reach ties (docs/rules.md, Ties decided by who got there first):
the 53-bit sort key and its bounds, reached_at in events and their payload hash, and
the ledger's decision of when reached_at moves. No database, no Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.events import EventValidationError, ScoreEvent, events_parse
from leaderboard.core.ledger import APPLIED, UNCHANGED, PlayerState, batch_plan
from leaderboard.core.tiebreak import (
    KEY_LIMIT,
    first_reached_of,
    first_reached_problem,
    reached_rejection,
    sort_key_decode,
    sort_key_encode,
)

START = datetime(2026, 1, 1, tzinfo=UTC)
CUTOFF = datetime(2026, 4, 1, tzinfo=UTC)


@st.composite
def bucket_members(draw: st.DrawFn) -> tuple[int, int, int, list[tuple[int, int]]]:
    """A bucket [low, high] and bits that fit 53 bits, and members (score, reached_ms) in it."""
    bits = draw(st.integers(1, 45))
    width = draw(st.integers(1, min(1_000_001, KEY_LIMIT >> bits)))
    low = draw(st.integers(0, 1_000_001 - width))
    high = low + width - 1
    member = st.tuples(st.integers(low, high), st.integers(0, (1 << bits) - 1))
    return low, high, bits, draw(st.lists(member, min_size=1, max_size=30))


@given(bucket_members())
def test_sort_key_is_exact_in_a_double_and_decodes_back(case: tuple[int, int, int, list[tuple[int, int]]]) -> None:
    _, high, bits, members = case
    for score, reached in members:
        key = sort_key_encode(score, reached, high=high, bits=bits)
        assert 0 <= key < KEY_LIMIT
        assert int(float(key)) == key  # what Redis stores is a double
        assert sort_key_decode(int(float(key)), high=high, bits=bits) == (score, reached)


@given(bucket_members())
def test_ascending_keys_are_score_descending_then_reached_ascending(
        case: tuple[int, int, int, list[tuple[int, int]]]) -> None:
    _, high, bits, members = case
    by_key = sorted(members, key=lambda m: float(sort_key_encode(*m, high=high, bits=bits)))
    assert [(-s, r) for s, r in by_key] == sorted((-s, r) for s, r in members)
    for a in members:
        for b in members:
            ka, kb = (float(sort_key_encode(*m, high=high, bits=bits)) for m in (a, b))
            assert (ka < kb) == ((-a[0], a[1]) < (-b[0], b[1]))
            assert (ka == kb) == (a == b)


def test_season_encoding_spans_its_dates_in_milliseconds() -> None:
    ties = first_reached_of(starts_at=START, cutoff=CUTOFF)
    span = int((CUTOFF - START) / timedelta(milliseconds=1))
    assert (1 << (ties.bits - 1)) <= span < (1 << ties.bits)
    assert ties.reached_ms(START) == 0 and ties.reached_ms(CUTOFF) == span
    assert ties.reached_at(ties.reached_ms(START + timedelta(milliseconds=1234))) == START + timedelta(
        milliseconds=1234)


def test_default_layout_fits_a_quarter_but_not_a_century() -> None:
    layout = BucketLayout.uniform()
    assert first_reached_problem(layout=layout, starts_at=START, cutoff=CUTOFF) is None
    problem = first_reached_problem(layout=layout, starts_at=START, cutoff=START + timedelta(days=36_500))
    assert problem is not None and "at most" in problem and "10000" in problem
    # One bucket over all 1,000,001 scores (20 bits) leaves 33 bits of milliseconds: ~99 days.
    single = BucketLayout.single()
    assert first_reached_problem(layout=single, starts_at=START, cutoff=CUTOFF) is None
    assert first_reached_problem(layout=single, starts_at=START, cutoff=START + timedelta(days=100)) is not None


def test_reached_at_outside_the_season_is_refused_to_the_millisecond() -> None:
    assert reached_rejection(reached_at=START, starts_at=START, cutoff=CUTOFF) is None
    assert reached_rejection(reached_at=CUTOFF + timedelta(microseconds=999), starts_at=START, cutoff=CUTOFF) is None
    assert reached_rejection(reached_at=START - timedelta(milliseconds=1), starts_at=START,
                             cutoff=CUTOFF) == "reached_before_season_start"
    assert reached_rejection(reached_at=CUTOFF + timedelta(milliseconds=1), starts_at=START,
                             cutoff=CUTOFF) == "reached_after_cutoff"


# --- events -------------------------------------------------------------------------------


def raw(**extra: object) -> dict[str, object]:
    return {"event_id": "e1", "match_id": "m1", "player_id": "p1", "best_score": 5, "score_version": 1,
            "completed_at": "2026-02-01T10:00:00.123456Z", **extra}


def test_reached_at_is_optional_and_truncated_to_the_millisecond() -> None:
    (plain,) = events_parse(raw())
    assert plain.reached_at is None
    assert plain.reached == datetime(2026, 2, 1, 10, 0, 0, 123000, tzinfo=UTC)
    (given_,) = events_parse(raw(reached_at="2026-02-01T11:00:00.98765+01:00"))
    assert given_.reached == datetime(2026, 2, 1, 10, 0, 0, 987000, tzinfo=UTC)


@pytest.mark.parametrize("value", ["yesterday", "2026-02-01T10:00:00", "1969-12-31T23:59:59Z", 17])
def test_a_bad_reached_at_is_a_field_error(value: object) -> None:
    with pytest.raises(EventValidationError) as caught:
        events_parse(raw(reached_at=value))
    assert list(caught.value.errors) == ["reached_at"]


def test_payload_hash_counts_reached_at_only_when_it_differs_from_its_default() -> None:
    (plain,) = events_parse(raw())
    (spelled_out,) = events_parse(raw(reached_at="2026-02-01T10:00:00.123999Z"))
    (earlier,) = events_parse(raw(reached_at="2026-02-01T09:00:00Z"))
    legacy = ScoreEvent(event_id="e1", match_id="m1", player_id="p1", best_score=5, score_version=1,
                        completed_at=plain.completed_at)
    assert plain.payload_hash() == legacy.payload_hash() == spelled_out.payload_hash()
    assert earlier.payload_hash() != plain.payload_hash()


# --- ledger -------------------------------------------------------------------------------

T0 = datetime(2026, 2, 1, tzinfo=UTC)


def event(event_id: str, score: int, version: int, *, at: int, kind: str = "result") -> ScoreEvent:
    return ScoreEvent(event_id=event_id, match_id="m", player_id="p", best_score=score, score_version=version,
                      completed_at=T0 + timedelta(hours=1), reached_at=T0 + timedelta(seconds=at), kind=kind,
                      reason="fix" if kind == "correction" else "")


def plan(events: list[ScoreEvent], *, reached_orders: bool = True,
         current: dict[str, PlayerState] | None = None) -> object:
    return batch_plan(events=events, recorded={}, current=current or {}, rejection=lambda e: None,
                      pending_version=2, reached_orders=reached_orders)


def test_a_higher_result_moves_reached_at_and_an_equal_one_later_does_not() -> None:
    result = plan([event("a", 10, 1, at=5), event("b", 10, 2, at=1), event("c", 12, 3, at=9)])
    statuses = [o.status for o in result.outcomes]  # type: ignore[attr-defined]
    assert statuses == [APPLIED, UNCHANGED, APPLIED]
    changes = result.changes  # type: ignore[attr-defined]
    assert [(c.new_score, c.reached_at) for c in changes] == [(10, T0 + timedelta(seconds=5)),
                                                           (12, T0 + timedelta(seconds=9))]
    assert changes[1].old_reached_at == T0 + timedelta(seconds=5)
    assert result.player_states["p"].reached_at == T0 + timedelta(seconds=9)  # type: ignore[attr-defined]


def test_a_correction_sets_both_and_moving_only_reached_at_is_a_change_where_it_orders() -> None:
    before = {"p": PlayerState(score=10, score_version=1, reached_at=T0 + timedelta(seconds=5))}
    fix = [event("a", 10, 2, at=2, kind="correction")]
    ordered = plan(fix, current=before)
    assert [(c.new_score, c.reached_at) for c in ordered.changes] == [  # type: ignore[attr-defined]
        (10, T0 + timedelta(seconds=2))]
    assert ordered.outcomes[0].pending_version == 2  # type: ignore[attr-defined]
    shared = plan(fix, current=before, reached_orders=False)
    assert shared.changes == []  # type: ignore[attr-defined]
    assert shared.outcomes[0].pending_version is None  # type: ignore[attr-defined]
    # Still recorded, as in every season.
    assert shared.player_states["p"].reached_at == T0 + timedelta(seconds=2)  # type: ignore[attr-defined]
