"""A PostgreSQL that hangs under a write (a lock held on the current scores, a long
transaction sleeping with a player's row locked): the batch answers 503 within
WRITE_STATEMENT_TIMEOUT_SECONDS, nothing of it written, the reads go on from Redis and
the writes that need nothing locked go on too; the next batch after the lock is gone
commits."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from leaderboard.models import PlayerScore, ScoreEvent
from seasons.models import Season
from tests.support import Events, fast_get, post_ok, publish
from tests.support.pg_sessions import current_scores_locked, pg_session

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

Post = Callable[..., Any]
TIMEOUT = 0.5


@pytest.fixture
def scores_locked() -> Iterator[Callable[[], None]]:
    # Let go by itself later: a write path without a timeout then waits this long and the
    # test fails on the time taken, instead of hanging.
    with current_scores_locked(release_after=TIMEOUT + 4.0) as unlock:
        yield unlock


def test_a_batch_behind_a_locked_table_answers_503_in_time_and_writes_nothing(
        season: Season, post_scores: Post, settings: Any, scores_locked: Callable[[], None]) -> None:
    settings.WRITE_STATEMENT_TIMEOUT_SECONDS = TIMEOUT
    events = Events(season.slug)
    started = time.monotonic()
    response = post_scores(season.slug, {"events": [events.result("p1", 10), events.result("p2", 20)]})
    took = time.monotonic() - started
    assert response.status_code == 503, response.content
    assert response.json()["error"] == "unavailable" and response["Retry-After"]
    assert took < TIMEOUT + 2.0, took
    scores_locked()
    assert not ScoreEvent.objects.filter(season_id=season.pk).exists()  # nothing half-written
    # Sent again once the lock is gone: applied, as if the first had never been sent.
    outcomes = post_ok(post_scores, season, [events.result("p1", 10), events.result("p2", 20)])
    assert [o["status"] for o in outcomes] == ["applied", "applied"]


def test_reads_go_on_from_redis_while_a_write_waits_on_a_locked_table(
        season: Season, post_scores: Post, settings: Any, rank_views: Any) -> None:
    events = Events(season.slug)
    post_ok(post_scores, season, [events.result("p1", 10)])
    publish(season)
    settings.WRITE_STATEMENT_TIMEOUT_SECONDS = TIMEOUT
    with current_scores_locked(release_after=TIMEOUT + 4.0):
        assert post_scores(season.slug, {"events": [events.result("p2", 20)]}).status_code == 503
        read = fast_get(f"/v1/seasons/{season.slug}/players/p1/rank")
        assert read.status_code == 200 and read.json()["rank"] == 1


def test_a_batch_behind_a_long_transaction_holding_a_players_row_answers_503_and_other_writes_go_on(
        season: Season, post_scores: Post, settings: Any) -> None:
    events = Events(season.slug)
    post_ok(post_scores, season, [events.result("p1", 10)])
    settings.WRITE_STATEMENT_TIMEOUT_SECONDS = TIMEOUT
    other = pg_session(autocommit=False)
    holding = threading.Event()

    def hold() -> None:
        # What a stray maintenance transaction does: takes a row, then does not finish.
        other.execute(f"SELECT 1 FROM {PlayerScore._meta.db_table} WHERE season_id = %s AND player_id = 'p1' "
                      "FOR UPDATE", [season.pk])
        holding.set()
        with contextlib.suppress(psycopg.errors.QueryCanceled):
            other.execute("SELECT pg_sleep(%s)", [TIMEOUT + 10])

    sleeper = threading.Thread(target=hold)
    sleeper.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        response = post_scores(season.slug, {"events": [events.result("p1", 30)]})
        took = time.monotonic() - started
        assert response.status_code == 503 and response.json()["error"] == "unavailable", response.content
        assert took < TIMEOUT + 2.0, took
        assert ScoreEvent.objects.filter(season_id=season.pk, player_id="p1").count() == 1  # nothing half-written
        # A batch of players nobody holds commits while the long transaction still sleeps.
        assert [o["status"] for o in post_ok(post_scores, season, [events.result("p9", 5)])] == ["applied"]
        assert sleeper.is_alive()
    finally:
        other.cancel()
        sleeper.join(10)
        other.rollback()
        other.close()
    assert [o["status"] for o in post_ok(post_scores, season, [events.result("p1", 30)])] == ["applied"]
