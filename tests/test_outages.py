"""A dependency that does not answer: with Redis unreachable, reads answer 503 `unavailable`
with `retry_after` and a Retry-After header (fast read path and DRF views alike) and writes
still commit to the ledger; with PostgreSQL unreachable, writes answer 503 and the reads go
on from Redis; /readyz names the dependency that failed. An unreachable server is a port
on localhost nothing listens on: the connection is refused at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from leaderboard.api.errors import OUTAGE_RETRY_AFTER_SECONDS
from leaderboard.core.history import hour_floor
from leaderboard.history.services import movement_snapshot_name, season_snapshot_take
from leaderboard.models import Manifest
from leaderboard.redis_client import redis_get
from seasons.models import Season
from tests.support import NARROW, Events, browser, db_scores, fast_get, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
CLOSED_PORT = 1
READS = [
    "/v1/seasons/outage/leaderboard/top?limit=3",
    "/v1/seasons/outage/leaderboard?from_position=2&limit=2",
    "/v1/seasons/outage/players/p03/rank",
    "/v1/seasons/outage/players/p03/neighbors?radius=1",
    "/v1/seasons/unknown/leaderboard/top",
]


@pytest.fixture
def published(rank_views: Any, season_factory: Callable[..., Season], post_scores: Post) -> Season:
    season = season_factory(slug="outage", layout=NARROW)
    ev = Events(tag="out")
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", 10 * i) for i in range(10)])
    publish(season)
    return season


@pytest.fixture
def redis_unreachable(published: Season) -> Iterator[None]:
    """After `published`, the app's Redis client points at a closed port (redis_get() caches its client)."""
    redis_get.cache_clear()
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{CLOSED_PORT}/0"):
        yield
    redis_get.cache_clear()


def assert_unavailable(status: int, body: Any, retry_header: str | None) -> None:
    assert status == 503, body
    assert body["error"] == "unavailable"
    assert body["retry_after"] == OUTAGE_RETRY_AFTER_SECONDS
    assert retry_header == str(OUTAGE_RETRY_AFTER_SECONDS)


@pytest.mark.usefixtures("redis_unreachable")
@pytest.mark.parametrize("url", READS)
def test_with_redis_unreachable_reads_answer_503_with_retry_after_on_both_read_paths(url: str) -> None:
    fast = fast_get(url)
    assert_unavailable(fast.status_code, fast.json(), fast.headers.get("retry-after"))
    drf = APIClient().get(url)
    assert drf["Content-Type"] == "application/json"
    assert_unavailable(drf.status_code, drf.json(), drf.get("Retry-After"))


@pytest.mark.usefixtures("redis_unreachable")
def test_with_redis_unreachable_writes_still_commit_to_the_ledger(published: Season, post_scores: Post) -> None:
    results = post_ok(post_scores, published, [Events(tag="down").result("p03", 777)])
    assert results[0]["status"] == "applied"
    assert db_scores(published)["p03"] == 777


def closed_database_url() -> str:
    parts = urlsplit(browser.database_url())
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@127.0.0.1:{CLOSED_PORT}"))


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("fast_path", ["true", "false"])
def test_with_postgres_unreachable_reads_go_on_from_redis_and_writes_answer_503(
    published: Season, writer: Any, fast_path: str
) -> None:
    # Snapshots a day apart, so a rank answer carries rank_24h_ago: p03's is kept in Redis
    # by the read below, p05's needs the database.
    latest = hour_floor(datetime.now(UTC))
    Manifest.objects.filter(season=published).update(published_at=latest - timedelta(hours=25))
    for hour in (latest - timedelta(hours=24), latest):
        season_snapshot_take(season=published, taken_for=hour)
    assert movement_snapshot_name(season=published) is not None
    expected = {url: APIClient().get(url) for url in READS[:4]}
    assert expected[READS[2]].json()["rank_24h_ago"] == 7
    with browser.asgi_server(DATABASE_URL=closed_database_url(), DB_POOL_TIMEOUT="1",
                             READ_FAST_PATH=fast_path) as base, httpx.Client(base_url=base, timeout=30) as client:
        for url, answer in expected.items():
            response = client.get(url)
            assert (response.status_code, response.json()) == (200, answer.json()), url
        # The rank is Redis's: without the database only the movement not kept yet is lost.
        uncached = client.get("/v1/seasons/outage/players/p05/rank")
        assert uncached.status_code == 200 and (uncached.json()["rank"], uncached.json()["rank_24h_ago"]) == (5, None)
        write = client.post("/internal/v1/seasons/outage/scores:apply", json={"events": [Events().result("p01", 5)]},
                            headers={"Authorization": f"Bearer {writer[1]}"})
        assert_unavailable(write.status_code, write.json(), write.headers.get("retry-after"))
        # What needs the database answers 503 too: a pending score, a season Redis does not know,
        # a friends board (its friend list).
        for url in ("/v1/seasons/outage/players/p03/rank?include_pending=true", "/v1/seasons/unknown/leaderboard/top",
                    "/v1/seasons/outage/players/p03/friends"):
            response = client.get(url)
            assert_unavailable(response.status_code, response.json(), response.headers.get("retry-after"))
        # Those 503s leave the reads from Redis answering at once: the fast path remembers
        # only a Redis outage.
        for url, answer in expected.items():
            response = client.get(url)
            assert (response.status_code, response.json()) == (200, answer.json()), url
        ready = client.get("/readyz")
        assert ready.status_code == 503
        checks = ready.json()["checks"]
        assert checks["redis"] == "ok" and checks["database"].startswith("error: "), checks
    assert db_scores(published)["p01"] == 10
