"""events_parse: the validator of score events (docs/api.md, Writes), field by field and batch shapes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from leaderboard.core.events import (
    MAX_BATCH,
    BatchTooLarge,
    EventValidationError,
    ScoreEvent,
    events_parse,
)

SCORE_ERROR = "must be an integer in 0..1000000"
SCORE_RANGE_ERROR = "out of range: must be in 0..1000000"
VERSION_ERROR = "must be an integer in 1..9223372036854775807"
VERSION_RANGE_ERROR = "out of range: must be in 1..9223372036854775807 (the largest 64-bit integer)"
PLAYER_ERROR = "must be 1..64 characters from [A-Za-z0-9_.:-]"
ID_LENGTH_ERROR = "must be 1..64 characters"
TIME_ERROR = ("must be an RFC 3339 date-time with an offset between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z, "
              "e.g. 2026-01-31T18:00:00Z")


def valid(**overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event_id": "evt-1",
        "match_id": "match-1",
        "player_id": "player-1",
        "best_score": 1000,
        "score_version": 1,
        "completed_at": "2026-11-15T12:00:00Z",
    }
    event.update(overrides)
    return event


def errors_of(body: Any) -> dict[str, list[str]]:
    with pytest.raises(EventValidationError) as caught:
        events_parse(body)
    return caught.value.errors


# --- a valid event ---------------------------------------------------------------------


def test_valid_single_event_parses_with_defaults() -> None:
    (event,) = events_parse(valid())
    assert event == ScoreEvent(
        event_id="evt-1", match_id="match-1", player_id="player-1", best_score=1000,
        score_version=1, completed_at=datetime(2026, 11, 15, 12, tzinfo=UTC), kind="result",
        reason="",
    )


def test_valid_correction_keeps_kind_and_reason() -> None:
    (event,) = events_parse(valid(kind="correction", reason="cheating confirmed"))
    assert (event.kind, event.reason) == ("correction", "cheating confirmed")


def test_explicit_result_kind_and_null_reason_are_accepted() -> None:
    (event,) = events_parse(valid(kind="result", reason=None))
    assert (event.kind, event.reason) == ("result", "")


# --- missing and unknown fields ----------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["event_id", "match_id", "player_id", "best_score", "score_version", "completed_at"]
)
def test_missing_required_field(field: str) -> None:
    body = valid()
    del body[field]
    assert errors_of(body) == {field: ["this field is required"]}


def test_unknown_field() -> None:
    assert errors_of(valid(bonus=5)) == {"bonus": ["unknown field"]}


def test_empty_object_lists_every_required_field() -> None:
    errors = errors_of({})
    assert sorted(errors) == sorted(
        ["event_id", "match_id", "player_id", "best_score", "score_version", "completed_at"]
    )


# --- best_score --------------------------------------------------------------------------


@pytest.mark.parametrize("score", [0, 1, 999_999, 1_000_000])
def test_best_score_bounds_accepted(score: int) -> None:
    (event,) = events_parse(valid(best_score=score))
    assert event.best_score == score


@pytest.mark.parametrize(
    "score",
    [10.0, 10.5, "10", "", None, True, False, [10], {"v": 10}],
    ids=["float-integral", "float", "string", "empty-string", "null", "bool-true", "bool-false", "list", "object"],
)
def test_best_score_that_is_no_integer_is_rejected_naming_the_range(score: Any) -> None:
    assert errors_of(valid(best_score=score)) == {"best_score": [SCORE_ERROR]}


@pytest.mark.parametrize(
    "score", [-1, 1_000_001, 2**70, float(2**70)], ids=["minus1", "1000001", "2^70", "2^70-as-orjson-reads-it"]
)
def test_best_score_out_of_range_is_rejected_as_out_of_range(score: Any) -> None:
    assert errors_of(valid(best_score=score)) == {"best_score": [SCORE_RANGE_ERROR]}


# --- score_version -----------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2**63 - 1])
def test_score_version_bounds_accepted(version: int) -> None:
    (event,) = events_parse(valid(score_version=version))
    assert event.score_version == version


@pytest.mark.parametrize("version", [1.0, "1", True, None], ids=["float", "string", "bool", "null"])
def test_score_version_that_is_no_integer_is_rejected_naming_the_range(version: Any) -> None:
    assert errors_of(valid(score_version=version)) == {"score_version": [VERSION_ERROR]}


@pytest.mark.parametrize(
    "version", [0, -1, 2**63, 2**70, float(2**70)], ids=["zero", "negative", "2^63", "2^70", "2^70-as-orjson-reads-it"]
)
def test_score_version_out_of_range_says_out_of_range_and_the_bigint_bound(version: Any) -> None:
    assert errors_of(valid(score_version=version)) == {"score_version": [VERSION_RANGE_ERROR]}


# --- player_id ---------------------------------------------------------------------------


@pytest.mark.parametrize("player_id", ["a", "A-z_0.9:x", "p" * 64])
def test_player_id_accepted(player_id: str) -> None:
    (event,) = events_parse(valid(player_id=player_id))
    assert event.player_id == player_id


@pytest.mark.parametrize(
    "player_id",
    ["", "p" * 65, "has space", "slash/", "émile", "tab\t", "new\n", "a" * 63 + "\n", "#1"],
    ids=["empty", "65-chars", "space", "slash", "non-ascii", "tab", "newline", "trailing-newline", "hash"],
)
def test_player_id_rejected(player_id: str) -> None:
    assert errors_of(valid(player_id=player_id)) == {"player_id": [PLAYER_ERROR]}


def test_player_id_not_a_string() -> None:
    assert errors_of(valid(player_id=42)) == {"player_id": ["must be a string"]}


# --- event_id / match_id -----------------------------------------------------------------


@pytest.mark.parametrize("field", ["event_id", "match_id"])
def test_text_id_of_64_chars_with_any_printable_characters_accepted(field: str) -> None:
    value = "é/ #" + "x" * 60
    (event,) = events_parse(valid(**{field: value}))
    assert getattr(event, field) == value


@pytest.mark.parametrize("field", ["event_id", "match_id"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x" * 65, ID_LENGTH_ERROR),
        ("", ID_LENGTH_ERROR),
        ("bad\x00id", "must not contain control characters"),
        ("bad\nid", "must not contain control characters"),
        ("ev-\u0085", "must not contain control characters"),
        ("ev-\u009f", "must not contain control characters"),
        ("ev-\x7f", "must not contain control characters"),
        (17, "must be a string"),
        (None, "must be a string"),
    ],
    ids=["65-chars", "empty", "nul", "newline", "c1-nel", "c1-last", "del", "int", "null"],
)
def test_text_id_rejected(field: str, value: Any, message: str) -> None:
    assert errors_of(valid(**{field: value})) == {field: [message]}


# --- completed_at ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-15T12:00:00Z", datetime(2026, 11, 15, 12, tzinfo=UTC)),
        ("2026-11-15t12:00:00z", datetime(2026, 11, 15, 12, tzinfo=UTC)),
        ("2026-11-15T12:00:00+02:00", datetime(2026, 11, 15, 10, tzinfo=UTC)),
        ("2026-11-15T12:00:00-05:30", datetime(2026, 11, 15, 17, 30, tzinfo=UTC)),
        ("2026-11-15T12:00:00.5Z", datetime(2026, 11, 15, 12, 0, 0, 500000, tzinfo=UTC)),
        ("2026-11-15T12:00:00.123456789Z", datetime(2026, 11, 15, 12, 0, 0, 123456, tzinfo=UTC)),
        ("2026-11-15 12:00:00+00:00", datetime(2026, 11, 15, 12, tzinfo=UTC)),
        ("1970-01-01T00:00:00Z", datetime(1970, 1, 1, tzinfo=UTC)),
        ("9999-12-31T23:59:59Z", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
        ("9999-12-31T23:59:59+01:00", datetime(9999, 12, 31, 22, 59, 59, tzinfo=UTC)),
    ],
)
def test_completed_at_accepted_and_normalised_to_the_same_instant(text: str, expected: datetime) -> None:
    (event,) = events_parse(valid(completed_at=text))
    assert event.completed_at == expected
    assert event.completed_at.tzinfo is not None


def test_completed_at_keeps_the_senders_offset() -> None:
    (event,) = events_parse(valid(completed_at="2026-11-15T12:00:00+02:00"))
    assert event.completed_at.utcoffset() == timedelta(hours=2)
    assert event.completed_at.tzinfo == timezone(timedelta(hours=2))


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-15T12:00:00",  # no offset
        "2026-11-15",
        "garbage",
        "",
        "2026-02-30T00:00:00Z",  # no such day
        "2026-11-15T25:00:00Z",
        "2026-W46-7T12:00:00Z",  # week date
        "2026-11-15T12:00Z",  # no seconds
        "2026-11-15T12:00:00+0200",  # offset without colon
        "2026-11-15T12:00:00Z trailing",
        1763208000,
        None,
        # Outside 1970..9999 in UTC: the first two overflowed Python's datetime (a 500).
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00Z",
        "1969-12-31T23:59:59Z",
        "1970-01-01T00:30:00+01:00",
    ],
)
def test_completed_at_rejected(text: Any) -> None:
    assert errors_of(valid(completed_at=text)) == {"completed_at": [TIME_ERROR]}


# --- kind / reason -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bonus", "Result", "", None, 1])
def test_kind_invalid(kind: Any) -> None:
    assert errors_of(valid(kind=kind)) == {"kind": ["must be 'result' or 'correction'"]}


@pytest.mark.parametrize("reason", [None, "", "   "], ids=["null", "empty", "blank"])
def test_correction_without_reason(reason: Any) -> None:
    body = valid(kind="correction")
    if reason is not None:
        body["reason"] = reason
    assert errors_of(body) == {"reason": ["is required for a correction"]}


def test_reason_of_500_chars_accepted_and_501_rejected() -> None:
    (event,) = events_parse(valid(kind="correction", reason="r" * 500))
    assert event.reason == "r" * 500
    assert errors_of(valid(kind="correction", reason="r" * 501)) == {
        "reason": ["must be at most 500 characters"]
    }


def test_reason_with_nul_rejected() -> None:
    # PostgreSQL text cannot store NUL: it must be a 400, not a failed write.
    assert errors_of(valid(kind="correction", reason="bad\x00reason")) == {
        "reason": ["must not contain NUL characters"]
    }


def test_reason_is_free_text_with_newlines_and_any_characters() -> None:
    text = 'line 1\nline 2\t"quoted" \\ {a,b} NULL \u00e9\U0001f600'
    (event,) = events_parse(valid(kind="correction", reason=text))
    assert event.reason == text


def test_reason_not_a_string() -> None:
    assert errors_of(valid(reason=5)) == {"reason": ["must be a string"]}


def test_several_errors_of_one_event_are_all_reported() -> None:
    assert errors_of(valid(best_score=-1, score_version=0, player_id="", extra=1)) == {
        "best_score": [SCORE_RANGE_ERROR],
        "score_version": [VERSION_RANGE_ERROR],
        "player_id": [PLAYER_ERROR],
        "extra": ["unknown field"],
    }


# --- batch shapes ------------------------------------------------------------------------


def test_batch_of_events_parses_in_order() -> None:
    events = events_parse({"events": [valid(event_id=f"e{i}") for i in range(3)]})
    assert [e.event_id for e in events] == ["e0", "e1", "e2"]


def test_batch_error_keys_name_the_event_index_and_field() -> None:
    batch = [valid(event_id=f"e{i}") for i in range(5)]
    batch[3]["best_score"] = 1.5
    batch[4]["oops"] = True
    del batch[1]["match_id"]
    assert errors_of({"events": batch}) == {
        "events[1].match_id": ["this field is required"],
        "events[3].best_score": [SCORE_ERROR],
        "events[4].oops": ["unknown field"],
    }


def test_batch_with_a_non_object_event() -> None:
    assert errors_of({"events": [valid(), "nope"]}) == {"events[1]": ["must be a JSON object"]}


def test_empty_batch() -> None:
    assert errors_of({"events": []}) == {"events": ["must hold at least one event"]}


@pytest.mark.parametrize("events", [{"a": 1}, "x", None, 3], ids=["object", "string", "null", "int"])
def test_events_not_a_list(events: Any) -> None:
    assert errors_of({"events": events}) == {"events": ["must be a list of event objects"]}


def test_batch_with_an_extra_top_level_key() -> None:
    assert errors_of({"events": [valid()], "dry_run": True}) == {
        "dry_run": ["unknown field (a batch body holds only 'events')"]
    }


@pytest.mark.parametrize("body", [[valid()], "event", 7, None], ids=["bare-list", "string", "int", "null"])
def test_body_not_an_object(body: Any) -> None:
    assert errors_of(body) == {"body": ["must be a JSON object"]}


def test_batch_of_exactly_max_events_is_accepted() -> None:
    assert MAX_BATCH == 1000
    events = events_parse({"events": [valid(event_id=f"e{i}") for i in range(1000)]})
    assert len(events) == 1000
    assert events[-1].event_id == "e999"


def test_batch_of_1001_events_is_too_large() -> None:
    with pytest.raises(BatchTooLarge) as caught:
        events_parse({"events": [valid(event_id=f"e{i}") for i in range(1001)]})
    assert caught.value.size == 1001


def test_batch_size_is_checked_before_the_events_are_validated() -> None:
    with pytest.raises(BatchTooLarge):
        events_parse({"events": [{}] * 1001})


# --- payload hash (decides duplicate vs conflict) ----------------------------------------


def test_payload_hash_is_the_same_for_the_same_instant_in_another_offset() -> None:
    (utc,) = events_parse(valid(completed_at="2026-11-15T10:00:00Z"))
    (plus2,) = events_parse(valid(completed_at="2026-11-15T12:00:00+02:00"))
    assert utc.payload_hash() == plus2.payload_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"match_id": "match-2"}, {"player_id": "player-2"}, {"best_score": 1001},
        {"score_version": 2}, {"completed_at": "2026-11-15T12:00:00.000001Z"},
        {"kind": "correction", "reason": "x"}, {"reason": "note"},
    ],
)
def test_payload_hash_changes_with_every_field(change: dict[str, Any]) -> None:
    (base,) = events_parse(valid())
    (other,) = events_parse(valid(**change))
    assert base.payload_hash() != other.payload_hash()
