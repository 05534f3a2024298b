"""A PostgreSQL that hangs under a write (a lock held on the current scores, a statement that
never ends): the batch answers 503 within WRITE_STATEMENT_TIMEOUT_SECONDS, nothing of it
written, and the reads go on from Redis; the next batch after the lock is gone commits."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from leaderboard.models import ScoreEvent
from seasons.models import Season
from tests.support import Events, fast_get, post_ok, publish
from tests.support.pg_sessions import current_scores_locked

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
