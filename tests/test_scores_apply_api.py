"""POST /internal/v1/seasons/{season_id}/scores:apply (docs/api.md, Writes) on a real database,
plus a property test of score_events_apply against the brute-force reference model."""

from __future__ import annotations

import ast
import itertools
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, transaction
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from leaderboard.api_clients import api_token_hash
from leaderboard.core.events import events_parse
from leaderboard.core.lifecycle import REJECT_BEFORE_START
from leaderboard.ingest import ledger_store
from leaderboard.ingest.services import score_events_apply
from leaderboard.ingest.signals import batch_committed
from leaderboard.metrics.counters import metrics_key
from leaderboard.models import ApiClient, LateResult, PlayerScore, ScoreChange, ScoreEvent, ScoreEventConflict
from seasons.models import Season
from tests.conftest import SEASON_CUTOFF, SEASON_START
from tests.support import DEFAULT_KIND
from tests.support.reference import Script, as_json, event_scripts, reference_run, season_rejection

URL = "/internal/v1/seasons/{}/scores:apply"

Post = Callable[..., Any]
EventFactory = Callable[..., dict[str, Any]]


def counts(season: Season | None = None) -> dict[str, int]:
    def n(model: Any) -> int:
        qs = model.objects.all()
        return qs.filter(season=season).count() if season is not None else qs.count()

    return {
        "events": n(ScoreEvent),
        "scores": n(PlayerScore),
        "changes": n(ScoreChange),
        "conflicts": n(ScoreEventConflict),
    }


NOTHING = {"events": 0, "scores": 0, "changes": 0, "conflicts": 0}


def score_of(season: Season, player_id: str) -> tuple[int, int]:
    row = PlayerScore.objects.get(season=season, player_id=player_id)
    return row.score, row.score_version


# --- outcomes ----------------------------------------------------------------------------


def test_first_result_is_applied_and_written(
    season: Season, post_scores: Post, event_factory: EventFactory, writer: tuple[ApiClient, str]
) -> None:
    event = event_factory(event_id="evt-a", player_id="alice", best_score=1200, score_version=3)
    response = post_scores(season.slug, event)
    assert response.status_code == 200
    assert response.json() == {
        "results": [
            {"event_id": "evt-a", "status": "applied", "player_id": "alice", "score": 1200,
             "score_version": 3, "pending_version": 1},
        ],
        "leaderboard_version": 0,
        "kind": DEFAULT_KIND,
    }
    assert score_of(season, "alice") == (1200, 3)
    row = ScoreEvent.objects.get(season=season, event_id="evt-a")
    assert (row.match_id, row.player_id, row.best_score, row.score_version, row.kind, row.reason) == (
        event["match_id"], "alice", 1200, 3, "result", "",
    )
    assert row.completed_at == datetime(2026, 11, 15, 12, tzinfo=UTC)
    assert (row.status, row.status_reason, row.score_after, row.version_after, row.pending_version) == (
        "applied", "", 1200, 3, 1,
    )
    assert row.client_id == writer[0].pk
    assert row.payload_hash == events_parse(event)[0].payload_hash()
    change = ScoreChange.objects.get(season=season)
    assert (change.player_id, change.old_score, change.new_score, change.score_version, change.event_id) == (
        "alice", None, 1200, 3, "evt-a",
    )
    assert counts() == {"events": 1, "scores": 1, "changes": 1, "conflicts": 0}


def test_pending_version_is_published_version_plus_one(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    Season.objects.filter(pk=season.pk).update(published_version=41)
    response = post_scores(season.slug, event_factory(best_score=5))
    body = response.json()
    assert body["leaderboard_version"] == 41
    assert body["results"][0]["status"] == "applied"
    assert body["results"][0]["pending_version"] == 42
    assert ScoreEvent.objects.get().pending_version == 42


def test_higher_result_raises_score_lower_result_is_unchanged(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    post_scores(season.slug, event_factory(player_id="p", best_score=100, score_version=1))
    up = post_scores(season.slug, event_factory(player_id="p", best_score=300, score_version=2)).json()
    assert (up["results"][0]["status"], up["results"][0]["score"]) == ("applied", 300)
    down = post_scores(season.slug, event_factory(player_id="p", best_score=50, score_version=3)).json()
    assert down["results"][0] == {
        "event_id": "evt-3", "status": "unchanged", "player_id": "p", "score": 300,
        "score_version": 3, "pending_version": None,
    }
    assert score_of(season, "p") == (300, 3)
    assert ScoreChange.objects.filter(season=season).count() == 2
    assert list(ScoreEvent.objects.order_by("id").values_list("status", flat=True)) == [
        "applied", "applied", "unchanged",
    ]


def test_stale_version_is_recorded_and_score_unchanged(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    post_scores(season.slug, event_factory(event_id="new", player_id="p", best_score=100, score_version=5))
    response = post_scores(
        season.slug, event_factory(event_id="old", player_id="p", best_score=999, score_version=5)
    )
    assert response.json()["results"] == [
        {"event_id": "old", "status": "stale", "reason": "score_version_not_newer", "player_id": "p",
         "score": 100, "score_version": 5, "pending_version": None},
    ]
    assert score_of(season, "p") == (100, 5)
    stale = ScoreEvent.objects.get(event_id="old")
    assert (stale.status, stale.status_reason, stale.best_score, stale.score_after) == (
        "stale", "score_version_not_newer", 999, 100,
    )
    assert ScoreChange.objects.count() == 1


def test_correction_lowers_the_score(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    post_scores(season.slug, event_factory(player_id="champ", best_score=900_000, score_version=1))
    response = post_scores(
        season.slug,
        event_factory(
            event_id="fix-1", player_id="champ", best_score=10, score_version=2, kind="correction",
            reason="score revoked: cheating",
        ),
    )
    assert response.json()["results"] == [
        {"event_id": "fix-1", "status": "applied", "player_id": "champ", "score": 10,
         "score_version": 2, "pending_version": 1},
    ]
    assert score_of(season, "champ") == (10, 2)
    row = ScoreEvent.objects.get(event_id="fix-1")
    assert (row.kind, row.reason) == ("correction", "score revoked: cheating")
    assert list(ScoreChange.objects.order_by("id").values_list("old_score", "new_score")) == [
        (None, 900_000), (900_000, 10),
    ]


def test_duplicate_answers_first_status_and_changes_nothing(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    event = event_factory(event_id="dup", player_id="p", best_score=70, score_version=1)
    first = post_scores(season.slug, event).json()["results"][0]
    before = counts()
    Season.objects.filter(pk=season.pk).update(published_version=3)
    # the same instant written with another offset is the same payload
    retry = dict(event, completed_at="2026-11-15T14:00:00+02:00")
    again = post_scores(season.slug, retry).json()
    assert again["results"] == [
        {"event_id": "dup", "status": "duplicate", "first_status": "applied", "player_id": "p",
         "score": 70, "score_version": 1, "pending_version": first["pending_version"]},
    ]
    assert first["pending_version"] == 1
    assert again["leaderboard_version"] == 3
    assert counts() == before


def test_duplicate_of_a_stale_event_reports_first_status_stale(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    post_scores(season.slug, event_factory(player_id="p", score_version=2))
    stale = event_factory(event_id="s", player_id="p", score_version=1)
    post_scores(season.slug, stale)
    result = post_scores(season.slug, stale).json()["results"][0]
    assert (result["status"], result["first_status"], result["reason"]) == (
        "duplicate", "stale", "score_version_not_newer",
    )


def test_conflicting_retry_writes_only_a_conflict_row(
    season: Season, post_scores: Post, event_factory: EventFactory, writer: tuple[ApiClient, str]
) -> None:
    event = event_factory(event_id="e", player_id="p", best_score=70, score_version=1)
    post_scores(season.slug, event)
    before = counts()
    changed = dict(event, best_score=71)
    response = post_scores(season.slug, changed)
    assert response.status_code == 200
    assert response.json()["results"] == [
        {"event_id": "e", "status": "conflict", "reason": "event_id_reused_with_different_payload",
         "player_id": "p", "score": None, "score_version": None, "pending_version": None},
    ]
    assert counts() == dict(before, conflicts=1)
    assert score_of(season, "p") == (70, 1)
    conflict = ScoreEventConflict.objects.get()
    assert conflict.event_id == "e"
    assert conflict.payload["best_score"] == 71
    assert conflict.payload_hash == events_parse(changed)[0].payload_hash()
    assert conflict.client_id == writer[0].pk
    assert ScoreEvent.objects.get(event_id="e").best_score == 70


def test_batch_events_take_effect_in_order(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    events = [
        event_factory(event_id="b1", player_id="p", best_score=100, score_version=1),
        event_factory(event_id="b2", player_id="p", best_score=500, score_version=2),
        event_factory(event_id="b3", player_id="p", best_score=40, score_version=3,
                      kind="correction", reason="revoked"),
        event_factory(event_id="b4", player_id="p", best_score=60, score_version=4),
        event_factory(event_id="b5", player_id="p", best_score=999, score_version=4),
        event_factory(event_id="b2", player_id="p", best_score=500, score_version=2),
        event_factory(event_id="b1", player_id="p", best_score=101, score_version=1),
    ]
    # event_factory numbers match ids; make the retried events exact copies
    events[5] = dict(events[1])
    events[6] = dict(events[0], best_score=101)
    response = post_scores(season.slug, {"events": events})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [(r["event_id"], r["status"], r["score"], r["score_version"]) for r in results] == [
        ("b1", "applied", 100, 1),
        ("b2", "applied", 500, 2),
        ("b3", "applied", 40, 3),
        ("b4", "applied", 60, 4),
        ("b5", "stale", 60, 4),
        ("b2", "duplicate", 500, 2),
        ("b1", "conflict", None, None),
    ]
    assert results[5]["first_status"] == "applied"
    assert score_of(season, "p") == (60, 4)
    assert list(
        ScoreChange.objects.order_by("id").values_list("event_id", "old_score", "new_score")
    ) == [("b1", None, 100), ("b2", 100, 500), ("b3", 500, 40), ("b4", 40, 60)]
    assert list(ScoreEvent.objects.order_by("id").values_list("event_id", flat=True)) == [
        "b1", "b2", "b3", "b4", "b5",
    ]
    assert counts() == {"events": 5, "scores": 1, "changes": 4, "conflicts": 1}


@pytest.mark.parametrize(
    ("event_id", "match_id", "reason"),
    [
        ('e"{,}\\ \u00e9', "NULL", 'quote " backslash \\ braces {a,b} NULL'),
        ("NULL", "m,1", "NULL"),
        ("\U0001f600 emoji", "{}", "new\nline\ttab \u4e2d"),
    ],
    ids=["quotes-braces-backslash", "null-word", "unicode-newline"],
)
def test_text_fields_round_trip_exactly(
    season: Season, post_scores: Post, event_factory: EventFactory, event_id: str, match_id: str,
    reason: str,
) -> None:
    event = event_factory(event_id=event_id, match_id=match_id, kind="correction", reason=reason,
                          player_id="p.1:x_Y-z")
    assert post_scores(season.slug, event).json()["results"][0]["status"] == "applied"
    row = ScoreEvent.objects.get()
    assert (row.event_id, row.match_id, row.reason, row.player_id) == (event_id, match_id, reason, "p.1:x_Y-z")
    assert ScoreChange.objects.get().event_id == event_id
    # and the retry is recognised as the same payload
    assert post_scores(season.slug, event).json()["results"][0]["status"] == "duplicate"


def test_completed_at_offset_and_microseconds_are_stored_as_the_same_instant(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    post_scores(season.slug, event_factory(completed_at="2026-11-15T12:00:00.123456-05:30"))
    assert ScoreEvent.objects.get().completed_at == datetime(2026, 11, 15, 17, 30, 0, 123456, tzinfo=UTC)


@pytest.mark.postgres
def test_completed_at_with_an_offset_postgresql_cannot_parse_is_applied_at_its_instant(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    # RFC 3339 allows offsets up to +-23:59, PostgreSQL's input stops short of +-16:00: the
    # fuzzer's "+20:16" was a 500 while the instant went to the database with its offset.
    response = post_scores(season.slug, event_factory(completed_at="2026-11-15T12:00:00+20:16"))
    assert response.status_code == 200
    assert response.json()["results"][0]["status"] == "applied"
    assert ScoreEvent.objects.get().completed_at == datetime(2026, 11, 14, 15, 44, tzinfo=UTC)


def test_batch_of_1000_events_is_applied(season: Season, post_scores: Post) -> None:
    events = [
        {"event_id": f"e{i}", "match_id": f"m{i}", "player_id": f"player{i % 400}",
         "best_score": i, "score_version": i + 1, "completed_at": "2026-11-15T12:00:00Z"}
        for i in range(1000)
    ]
    response = post_scores(season.slug, {"events": events})
    assert response.status_code == 200
    assert len(response.json()["results"]) == 1000
    assert {r["status"] for r in response.json()["results"]} == {"applied"}
    assert counts() == {"events": 1000, "scores": 400, "changes": 1000, "conflicts": 0}
    assert score_of(season, "player7") == (807, 808)


def test_seasons_are_independent(
    season_factory: Callable[..., Season], post_scores: Post, event_factory: EventFactory
) -> None:
    one, two = season_factory(slug="one"), season_factory(slug="two")
    event = event_factory(event_id="same", player_id="p", best_score=5)
    assert post_scores(one.slug, event).json()["results"][0]["status"] == "applied"
    assert post_scores(two.slug, event).json()["results"][0]["status"] == "applied"
    assert counts(one) == counts(two) == {"events": 1, "scores": 1, "changes": 1, "conflicts": 0}


# --- admission: lifecycle and cutoff -----------------------------------------------------


def test_completed_after_cutoff_is_rejected_and_recorded(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    post_scores(season.slug, event_factory(player_id="p", best_score=10, score_version=1))
    late = (season.cutoff + timedelta(seconds=1)).isoformat()
    response = post_scores(
        season.slug, event_factory(event_id="late", player_id="p", best_score=99, score_version=2,
                                   completed_at=late),
    )
    assert response.json()["results"] == [
        {"event_id": "late", "status": "rejected", "reason": "after_cutoff", "player_id": "p",
         "score": 10, "score_version": 1, "pending_version": None},
    ]
    row = ScoreEvent.objects.get(event_id="late")
    assert (row.status, row.status_reason, row.best_score) == ("rejected", "after_cutoff", 99)
    assert score_of(season, "p") == (10, 1)
    assert ScoreChange.objects.count() == 1


def test_completed_exactly_at_cutoff_is_accepted(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    at_cutoff = season.cutoff.isoformat()
    result = post_scores(season.slug, event_factory(completed_at=at_cutoff)).json()["results"][0]
    assert result["status"] == "applied"


def test_completed_before_season_start_is_rejected(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    early = (season.starts_at - timedelta(seconds=1)).isoformat()
    result = post_scores(season.slug, event_factory(completed_at=early)).json()["results"][0]
    assert (result["status"], result["reason"], result["score"]) == ("rejected", "before_season_start", None)
    assert PlayerScore.objects.count() == 0


def test_scheduled_season_rejects_with_season_not_open(
    season_factory: Callable[..., Season], post_scores: Post, event_factory: EventFactory
) -> None:
    now = datetime.now(UTC)
    future = season_factory(slug="future", starts_at=now + timedelta(days=5), cutoff=now + timedelta(days=30))
    assert future.state == "SCHEDULED"
    completed = (now + timedelta(days=6)).isoformat()
    response = post_scores(future.slug, event_factory(event_id="x", player_id="p", completed_at=completed))
    assert response.json()["results"] == [
        {"event_id": "x", "status": "rejected", "reason": "season_not_open", "player_id": "p",
         "score": None, "score_version": None, "pending_version": None},
    ]
    assert ScoreEvent.objects.get(event_id="x").status_reason == "season_not_open"
    assert counts() == {"events": 1, "scores": 0, "changes": 0, "conflicts": 0}


@pytest.mark.parametrize("state", ["FINALIZING", "FINAL"])
def test_result_after_ingest_seal_is_held_out_of_the_board(
    state: str, season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    """docs/rules.md, Seal and late results: a pre-cutoff result arriving after the seal never enters the board."""
    post_scores(season.slug, event_factory(event_id="before", player_id="p", best_score=5, score_version=1))
    Season.objects.filter(pk=season.pk).update(state=state)
    result = post_scores(
        season.slug, event_factory(event_id="after", player_id="p", best_score=50, score_version=2)
    ).json()["results"][0]
    assert result == {
        "event_id": "after", "status": "rejected", "reason": "late_after_seal", "player_id": "p",
        "score": 5, "score_version": 1, "pending_version": None,
    }
    row = ScoreEvent.objects.get(event_id="after")
    assert (row.status, row.status_reason, row.best_score) == ("rejected", "late_after_seal", 50)
    assert score_of(season, "p") == (5, 1)
    assert ScoreChange.objects.count() == 1


def test_a_correction_after_the_seal_is_held_for_staff_and_changes_nothing(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    post_scores(season.slug, event_factory(player_id="champ", best_score=900, score_version=1))
    Season.objects.filter(pk=season.pk).update(state="FINAL")
    revoke = event_factory(event_id="revoke", player_id="champ", best_score=0, score_version=2,
                           kind="correction", reason="revoked champion")
    result = post_scores(season.slug, revoke).json()["results"][0]
    assert (result["status"], result["reason"], result["pending_version"]) == ("held", "correction_after_seal", None)
    assert score_of(season, "champ") == (900, 1)
    queued = LateResult.objects.get(season=season)
    assert (queued.player_id, queued.best_score, queued.ledger_event.kind) == ("champ", 0, "correction")
    # A retry is answered from the ledger: held once, never queued twice.
    again = post_scores(season.slug, revoke).json()["results"][0]
    assert (again["status"], again["first_status"]) == ("duplicate", "held")
    assert LateResult.objects.filter(season=season).count() == 1


def test_closing_season_still_accepts_pre_cutoff_results(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    Season.objects.filter(pk=season.pk).update(state="CLOSING")
    ok = post_scores(season.slug, event_factory(event_id="ok")).json()["results"][0]
    late = post_scores(
        season.slug,
        event_factory(event_id="late", completed_at=(season.cutoff + timedelta(hours=1)).isoformat()),
    ).json()["results"][0]
    assert (ok["status"], late["status"], late["reason"]) == ("applied", "rejected", "after_cutoff")


# --- the ledger is append-only -----------------------------------------------------------


def test_updating_a_ledger_row_is_refused_by_the_database(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    post_scores(season.slug, event_factory(event_id="e", best_score=5))
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        ScoreEvent.objects.filter(event_id="e").update(best_score=999_999)
    row = ScoreEvent.objects.get(event_id="e")
    row.status = "rejected"
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        row.save()
    assert ScoreEvent.objects.get(event_id="e").best_score == 5
    assert ScoreEvent.objects.get(event_id="e").status == "applied"


@pytest.mark.postgres
def test_deleting_a_ledger_row_is_refused_on_postgres(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    post_scores(season.slug, event_factory(event_id="e"))
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        ScoreEvent.objects.filter(event_id="e").delete()
    assert ScoreEvent.objects.filter(event_id="e").count() == 1


# --- malformed requests: 400, nothing written ---------------------------------------------


@pytest.mark.parametrize("raw", [b"{", b'{"event_id": "x",}', b"not json", b'{"a": NaN}'])
def test_malformed_json_is_400_and_writes_nothing(season: Season, api: APIClient, raw: bytes) -> None:
    response = api.post(URL.format(season.slug), data=raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"
    assert counts() == NOTHING


def test_empty_body_is_400_listing_required_fields(season: Season, api: APIClient) -> None:
    response = api.post(URL.format(season.slug), data=b"", content_type="application/json")
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "validation_error"
    assert set(body["fields"]) == {
        "event_id", "match_id", "player_id", "best_score", "score_version", "completed_at",
    }
    assert counts() == NOTHING


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"best_score": "100"}, "best_score"),
        ({"best_score": 1.5}, "best_score"),
        ({"best_score": True}, "best_score"),
        ({"best_score": -1}, "best_score"),
        ({"best_score": 1_000_001}, "best_score"),
        ({"score_version": 0}, "score_version"),
        ({"score_version": "1"}, "score_version"),
        ({"player_id": "bad id"}, "player_id"),
        ({"player_id": "p" * 65}, "player_id"),
        ({"player_id": ""}, "player_id"),
        ({"event_id": "e" * 65}, "event_id"),
        ({"completed_at": "2026-11-15T12:00:00"}, "completed_at"),
        ({"completed_at": "0001-01-01T00:00:00+01:00"}, "completed_at"),
        ({"completed_at": "9999-12-31T23:59:59-01:00"}, "completed_at"),
        ({"kind": "bonus"}, "kind"),
        ({"kind": "correction"}, "reason"),
        ({"reason": "r" * 501}, "reason"),
        ({"reason": "nul\x00"}, "reason"),
        ({"unexpected": 1}, "unexpected"),
    ],
)
def test_invalid_event_is_400_naming_the_field(
    season: Season, post_scores: Post, event_factory: EventFactory, overrides: dict[str, Any], field: str
) -> None:
    response = post_scores(season.slug, event_factory(**overrides))
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "validation_error"
    assert list(body["fields"]) == [field]
    assert counts() == NOTHING


@pytest.mark.parametrize("field", ["event_id", "match_id", "player_id", "best_score", "score_version", "completed_at"])
def test_missing_field_is_400(season: Season, post_scores: Post, event_factory: EventFactory, field: str) -> None:
    event = event_factory()
    del event[field]
    response = post_scores(season.slug, event)
    assert response.status_code == 400
    assert response.json()["fields"] == {field: ["this field is required"]}
    assert counts() == NOTHING


def test_one_invalid_event_fails_the_whole_batch(
    season: Season, post_scores: Post, event_factory: EventFactory
) -> None:
    events = [event_factory() for _ in range(5)]
    events[3]["best_score"] = 1_000_001
    response = post_scores(season.slug, {"events": events})
    assert response.status_code == 400
    assert response.json()["fields"] == {"events[3].best_score": ["out of range: must be in 0..1000000"]}
    assert counts() == NOTHING


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"events": []}, {"events": ["must hold at least one event"]}),
        ({"events": "x"}, {"events": ["must be a list of event objects"]}),
        ([{"event_id": "x"}], {"body": ["must be a JSON object"]}),
    ],
)
def test_bad_batch_shape_is_400(season: Season, post_scores: Post, body: Any, fields: dict[str, list[str]]) -> None:
    response = post_scores(season.slug, body)
    assert response.status_code == 400
    assert response.json()["fields"] == fields
    assert counts() == NOTHING


def test_batch_of_1001_events_is_413(season: Season, post_scores: Post, event_factory: EventFactory) -> None:
    response = post_scores(season.slug, {"events": [event_factory() for _ in range(1001)]})
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert counts() == NOTHING


def test_body_over_the_size_limit_is_413(season: Season, api: APIClient, event_factory: EventFactory) -> None:
    body = json.dumps({"events": [event_factory() for _ in range(20)]}).encode()
    assert len(body) > 1024
    with override_settings(SCORES_MAX_BODY_BYTES=1024):
        response = api.post(URL.format(season.slug), data=body, content_type="application/json")
        assert response.status_code == 413
        assert response.json()["error"] == "payload_too_large"
        small = api.post(
            URL.format(season.slug), data=json.dumps(event_factory()).encode(),
            content_type="application/json",
        )
        assert small.status_code == 200
    assert counts()["events"] == 1


# --- season, authentication and scope ----------------------------------------------------


def test_unknown_season_is_404(post_scores: Post, event_factory: EventFactory) -> None:
    response = post_scores("no-such-season", event_factory())
    assert response.status_code == 404
    assert response.json()["error"] == "season_not_found"
    assert counts() == NOTHING


def test_missing_token_is_401(season: Season, event_factory: EventFactory) -> None:
    response = APIClient().post(URL.format(season.slug), event_factory(), format="json")
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
    assert response["WWW-Authenticate"] == 'Bearer realm="leaderboard"'
    assert counts() == NOTHING


@pytest.mark.parametrize(
    "header",
    ["Bearer lbk_wrong-token", "Bearer", "Token abc", "Bearer a b"],
    ids=["wrong-token", "no-token", "wrong-scheme", "two-tokens"],
)
def test_bad_token_is_401(
    season: Season, event_factory: EventFactory, writer: tuple[ApiClient, str], header: str
) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.post(URL.format(season.slug), event_factory(), format="json")
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
    assert counts() == NOTHING


def test_unknown_season_with_bad_token_is_401_not_404(event_factory: EventFactory, db: Any) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer nope")
    assert client.post(URL.format("ghost"), event_factory(), format="json").status_code == 401


def test_token_without_the_scope_is_403(season: Season, event_factory: EventFactory) -> None:
    token = "lbk_reader-only-token"
    ApiClient.objects.create(
        name="reader", token_prefix=token[:12], token_hash=api_token_hash(token=token), scopes=["other"]
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.post(URL.format(season.slug), event_factory(), format="json")
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert counts() == NOTHING


def test_inactive_client_is_401(
    season: Season, post_scores: Post, event_factory: EventFactory, writer: tuple[ApiClient, str]
) -> None:
    ApiClient.objects.filter(pk=writer[0].pk).update(active=False)
    response = post_scores(season.slug, event_factory())
    assert response.status_code == 401
    assert counts() == NOTHING


def test_get_is_not_allowed(season: Season, api: APIClient) -> None:
    response = api.get(URL.format(season.slug))
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"


# --- after the commit: the batch is announced, and the metrics count it ------------------


@pytest.fixture
def announced() -> Iterator[list[dict[str, Any]]]:
    """What ingest.signals.batch_committed was sent with during the test."""
    sent: list[dict[str, Any]] = []

    def listen(*, season_slug: str, outcomes: list[tuple[str, str]], **_: object) -> None:
        sent.append({"season_slug": season_slug, "outcomes": outcomes})

    batch_committed.connect(listen, dispatch_uid="tests.announced")
    yield sent
    batch_committed.disconnect(dispatch_uid="tests.announced")


@pytest.mark.django_db(transaction=True)
def test_a_committed_batch_is_announced_and_the_metrics_count_its_outcomes(
    season: Season, post_scores: Post, event_factory: EventFactory, redis_flushed: Any,
    announced: list[dict[str, Any]],
) -> None:
    """Ingest sends batch_committed once the batch commits (it imports no metrics); the
    metrics' receiver, connected in LeaderboardConfig.ready, counts the outcomes in Redis."""
    applied = event_factory(event_id="c1", player_id="p1")
    early = event_factory(event_id="c2", player_id="p2", completed_at="2026-10-01T00:00:00Z")
    assert post_scores(season.slug, {"events": [applied, early]}).status_code == 200
    assert post_scores(season.slug, applied).json()["results"][0]["status"] == "duplicate"
    assert announced == [
        {"season_slug": season.slug, "outcomes": [("applied", ""), ("rejected", REJECT_BEFORE_START)]},
        {"season_slug": season.slug, "outcomes": [("duplicate", "")]},
    ]
    slug = season.slug
    assert redis_flushed.hgetall(metrics_key("events")) == {
        f"{slug}|applied".encode(): b"1", f"{slug}|rejected".encode(): b"1", f"{slug}|duplicate".encode(): b"1"}
    assert redis_flushed.hgetall(metrics_key("rejected")) == {f"{slug}|{REJECT_BEFORE_START}".encode(): b"1"}


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_rolls_back_is_neither_announced_nor_counted(
    season: Season, event_factory: EventFactory, redis_flushed: Any, announced: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write = ledger_store.batch_plan_write

    def write_then_fail(**kwargs: Any) -> None:
        write(**kwargs)
        raise DatabaseError("the batch's transaction fails after its rows were written")

    monkeypatch.setattr(ledger_store, "batch_plan_write", write_then_fail)
    with pytest.raises(DatabaseError, match="fails after its rows were written"):
        score_events_apply(season=season, events=events_parse(event_factory(player_id="p1")), client=None)
    assert counts(season) == NOTHING
    assert announced == []
    assert redis_flushed.hgetall(metrics_key("events")) == {}


# --- what ingest imports ---------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def _module_file(module: str) -> Path | None:
    base = REPO / module.replace(".", "/")
    return next((p for p in (base / "__init__.py", base.with_suffix(".py")) if p.is_file()), None)


class _Imports(ast.NodeVisitor):
    """The repository's modules a module imports: every import statement, or (`loading`) only
    those run when it is imported (not in a function, not under TYPE_CHECKING)."""

    def __init__(self, *, loading: bool) -> None:
        self.loading = loading
        self.found: set[str] = set()

    def _add(self, module: str) -> None:
        parts = module.split(".")
        self.found |= {m for i in range(1, len(parts) + 1) if _module_file(m := ".".join(parts[:i]))}

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        assert node.level == 0 and node.module, "the repository's imports are absolute"
        self._add(node.module)
        for alias in node.names:
            self._add(f"{node.module}.{alias.name}")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if not self.loading:
            self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if not (self.loading and "TYPE_CHECKING" in ast.unparse(node.test)):
            self.generic_visit(node)


def imports_of(module: str, *, loading: bool) -> set[str]:
    path = _module_file(module)
    assert path is not None, module
    visitor = _Imports(loading=loading)
    visitor.visit(ast.parse(path.read_text(), str(path)))
    return visitor.found - {module}


def imported_when_loading(modules: list[str]) -> dict[str, str]:
    """Every repository module importing `modules` loads, each with a module that imports it."""
    by: dict[str, str] = {}
    todo = list(modules)
    while todo:
        module = todo.pop()
        for found in imports_of(module, loading=True) - by.keys() - set(modules):
            by[found] = module
            todo.append(found)
    return by


def test_ingest_imports_neither_the_metrics_nor_the_views() -> None:
    """Counting a batch's outcomes must not pull the views into the write path: ingest
    announces a committed batch (ingest.signals.batch_committed) and the metrics listen.
    No module of leaderboard/ingest imports leaderboard.metrics or leaderboard.views, even
    in a function, and nothing they load on import does."""
    forbidden = ("leaderboard.metrics", "leaderboard.views")
    ingest = sorted(f"leaderboard.ingest.{p.stem}" for p in (REPO / "leaderboard/ingest").glob("*.py"))
    assert "leaderboard.ingest.services" in ingest
    direct = {m: sorted(n for n in imports_of(m, loading=False) if n.startswith(forbidden)) for m in ingest}
    assert direct == dict.fromkeys(ingest, []), direct
    loaded = imported_when_loading(ingest)
    assert {"leaderboard.core.ledger", "leaderboard.models", "seasons.models"} <= loaded.keys()
    assert {m: by for m, by in loaded.items() if m.startswith(forbidden)} == {}
    # The check sees such an import where there is one: the scrape reads the rank views.
    assert "leaderboard.views.rankview" in imported_when_loading(["leaderboard.metrics.render"])


# --- property: score_events_apply on the real database == the reference model -------------

_slugs = itertools.count(1)


@settings(
    max_examples=40, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=event_scripts(starts_at=SEASON_START, cutoff=SEASON_CUTOFF, max_events=30), latest=st.booleans(),
       ascending=st.booleans())
def test_score_events_apply_matches_reference_model(
    season_factory: Callable[..., Season], writer: tuple[ApiClient, str], script: Script, latest: bool,
    ascending: bool,
) -> None:
    """In a `best` season and in a `latest` one (`create_season --mode`), of either order (`--order`)."""
    season = season_factory(slug=f"prop-{next(_slugs)}", mode="latest" if latest else "best",
                            order="asc" if ascending else "desc")
    assert (season.state, season.starts_at, season.cutoff) == ("OPEN", SEASON_START, SEASON_CUTOFF)
    model, expected = reference_run(
        script, season_rejection(starts_at=season.starts_at, cutoff=season.cutoff), latest=latest,
        ascending=ascending,
    )

    outcomes: list[dict[str, Any]] = []
    for batch, published in zip(script.batches, script.published, strict=True):
        Season.objects.filter(pk=season.pk).update(published_version=published)
        events = events_parse({"events": [as_json(e) for e in batch]})
        result = score_events_apply(season=season, events=events, client=writer[0])
        assert result.leaderboard_version == published
        outcomes.extend(o.as_dict() for o in result.outcomes)

    assert outcomes == expected
    assert {
        p: (s, v)
        for p, s, v in PlayerScore.objects.filter(season=season).values_list("player_id", "score", "score_version")
    } == model.players
    assert [
        tuple(row)
        for row in ScoreChange.objects.filter(season=season).order_by("id").values_list(
            "player_id", "old_score", "new_score", "score_version", "event_id"
        )
    ] == model.changes
    recorded = {
        row[0]: row[1:]
        for row in ScoreEvent.objects.filter(season=season).values_list(
            "event_id", "match_id", "player_id", "best_score", "score_version", "completed_at",
            "kind", "reason", "status", "status_reason", "score_after", "version_after",
            "pending_version",
        )
    }
    assert recorded == {
        event_id: (
            *key[1:],
            first["status"], first.get("reason", ""), first["score"], first["score_version"],
            first["pending_version"],
        )
        for event_id, (key, first) in model.ledger.items()
    }
    assert list(
        ScoreEventConflict.objects.filter(season=season).order_by("id").values_list("event_id", flat=True)
    ) == model.conflicts
