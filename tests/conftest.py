"""Shared fixtures: real database (PostgreSQL in CI, SQLite by default) and real Redis."""

from __future__ import annotations

import importlib.util
import itertools
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from leaderboard.api_clients import api_client_create
from leaderboard.models import ApiClient
from seasons.models import Season
from seasons.services import season_create
from tests.support import TEST_ACTOR, browser, is_postgres

SEASON_START = datetime(2026, 11, 1, tzinfo=UTC)
SEASON_CUTOFF = datetime.now(UTC) + timedelta(days=30)
# The cluster this session started (TEST_REDIS_CLUSTER), for pytest_unconfigure to stop.
SESSION_CLUSTER = pytest.StashKey[Any]()


def pytest_configure(config: pytest.Config) -> None:
    """TEST_REDIS_CLUSTER=1 puts the rank views on a Redis Cluster of 3 masters that this
    session starts on free ports (config/local_cluster.py) and stops at its end;
    TEST_REDIS_CLUSTER_URL=redis://host:port names a node of a running cluster instead
    (flushed between tests like the single Redis: keep nothing there). The Celery broker
    and the channel layer stay on REDIS_URL's plain Redis, as a cluster deployment must
    have them. Without either variable nothing changes."""
    url = os.environ.get("TEST_REDIS_CLUSTER_URL", "")
    if not url and os.environ.get("TEST_REDIS_CLUSTER", "").lower() in {"1", "true", "yes", "on"}:
        from tests.support.cluster import cluster_start

        started = cluster_start(masters=3)
        config.stash[SESSION_CLUSTER] = started
        url = started.url
    if url:
        rank_views_on_cluster(url)


def pytest_unconfigure(config: pytest.Config) -> None:
    started = config.stash.get(SESSION_CLUSTER, None)
    if started is not None:
        from tests.support.cluster import cluster_stop

        cluster_stop(started)


def rank_views_on_cluster(url: str) -> None:
    """Settings, and the environment child processes inherit, as a cluster deployment's."""
    from django.conf import settings

    from leaderboard.redis_client import redis_get

    os.environ.update({
        "REDIS_CLUSTER": "true", "REDIS_URL": url,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CHANNEL_LAYER_URL": ",".join(settings.CHANNEL_LAYER_URLS),
    })
    settings.REDIS_CLUSTER = True
    settings.REDIS_URL = url
    redis_get.cache_clear()


def pytest_report_header(config: pytest.Config) -> str | None:
    from django.conf import settings

    return f"rank views on the Redis Cluster of {settings.REDIS_URL}" if settings.REDIS_CLUSTER else None



def postgres_missing() -> str | None:
    if is_postgres():
        return None
    return "needs PostgreSQL: set DATABASE_URL=postgres://... (this run uses SQLite)"


def browser_missing() -> str | None:
    if not os.path.exists(browser.CHROMIUM):
        return f"needs Chromium at {browser.CHROMIUM}: apt-get install chromium (Debian/Ubuntu)"
    if importlib.util.find_spec("playwright") is None:
        return "needs the playwright package: make install (it drives the system's Chromium: no `playwright install`)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips the tests marked `postgres` or `browser` (markers: pyproject.toml) that cannot
    run here, saying why; `slow` ones run unless deselected with -m "not slow"."""
    missing = {"postgres": postgres_missing(), "browser": browser_missing()}
    for item in items:
        for marker, reason in missing.items():
            if reason is not None and item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
    ledger_databases_allow(items)


def ledger_databases_allow(items: list[pytest.Item]) -> None:
    """With LEDGER_PARTITION_URLS set, a season's ledger rows live in several databases:
    every test that uses a database may use all of them (pytest-django then creates, and
    empties between tests, each one's test database). Unset, nothing changes."""
    if not os.environ.get("LEDGER_PARTITION_URLS"):
        return
    for item in items:
        marker = item.get_closest_marker("django_db")
        fixtures = set(getattr(item, "fixturenames", ()))
        if marker is None and not fixtures & {"db", "transactional_db", "live_server"}:
            continue
        kwargs = dict(marker.kwargs) if marker is not None else {}
        if marker is None and fixtures & {"transactional_db", "live_server"}:
            kwargs["transaction"] = True
        kwargs["databases"] = "__all__"
        args = marker.args if marker is not None else ()
        item.add_marker(pytest.mark.django_db(*args, **kwargs), append=False)


# Ledger partitions of the seasons tests create (unless a test names its own): 1, so the
# suite's commit numbers are the plain ones; TEST_SEASON_PARTITIONS=8 runs it partitioned.
TEST_SEASON_PARTITIONS = int(os.environ.get("TEST_SEASON_PARTITIONS", "1"))


@pytest.fixture
def season_factory(db: Any) -> Callable[..., Season]:
    counter = itertools.count(1)

    def make(**overrides: Any) -> Season:
        params: dict[str, Any] = {
            "slug": f"season-{next(counter)}",
            "name": "Test season",
            "starts_at": SEASON_START,
            "cutoff": SEASON_CUTOFF,
            "actor": TEST_ACTOR,
            "partitions": TEST_SEASON_PARTITIONS,
        }
        params.update(overrides)
        return season_create(**params)

    return make


@pytest.fixture
def season(season_factory: Callable[..., Season]) -> Season:
    return season_factory(slug="s1")


@pytest.fixture
def writer(db: Any) -> tuple[ApiClient, str]:
    return api_client_create(name="match-service", scopes=["scores:write"], actor=TEST_ACTOR)


@pytest.fixture
def api(writer: tuple[ApiClient, str]) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {writer[1]}")
    return client


@pytest.fixture
def event_factory() -> Callable[..., dict[str, Any]]:
    counter = itertools.count(1)

    def make(**overrides: Any) -> dict[str, Any]:
        n = next(counter)
        event: dict[str, Any] = {
            "event_id": f"evt-{n}",
            "match_id": f"match-{n}",
            "player_id": "player-1",
            "best_score": 1000,
            "score_version": n,
            "completed_at": "2026-11-15T12:00:00Z",
        }
        event.update(overrides)
        return event

    return make


@pytest.fixture
def post_scores(api: APIClient) -> Callable[..., Any]:
    def post(season_slug: str, body: Any, **extra: Any) -> Any:
        return api.post(
            f"/internal/v1/seasons/{season_slug}/scores:apply", body, format="json", **extra
        )

    return post


@pytest.fixture
def redis_flushed() -> Iterator[Any]:
    from leaderboard.redis_client import redis_get

    client = redis_get()
    redis_flush(client)
    yield client
    redis_flush(client)


def redis_flush(client: Any) -> None:
    """The rank views' Redis emptied: FLUSHDB on a single Redis (its other databases may be
    someone else's), FLUSHALL on every master of a cluster (a cluster has only database 0)."""
    from leaderboard.redis_client import redis_cluster_of

    cluster = redis_cluster_of(client)
    if cluster is None:
        client.flushdb()
    else:
        cluster.flushall(target_nodes=cluster.PRIMARIES)


@pytest.fixture
def rank_views(redis_flushed: Any, settings: Any) -> Iterator[Any]:
    """A flushed Redis and an empty manifest cache, for tests that run epochs back to back
    with no concurrent reader: no copy grace period, and a read deadline that a loaded
    machine cannot overrun (nothing mutates a copy during a read); yields the client."""
    from leaderboard.views import rankview

    rankview.manifest_cache_clear()
    settings.COPY_GRACE_SECONDS = 0.0
    settings.READ_DEADLINE_SECONDS = 60.0
    yield redis_flushed
    rankview.manifest_cache_clear()


@pytest.fixture
def without_catch_up(settings: Any) -> None:
    """Epochs leave the older copy alone after publishing (EPOCH_CATCH_UP off): the
    fallback path, where the next epoch brings it up from its own watermark and the
    previous version stays readable until then."""
    settings.EPOCH_CATCH_UP = False
