"""/healthz (the process is up) and /readyz (the database and Redis answer)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client, override_settings

from leaderboard.redis_client import redis_get


@pytest.fixture
def fresh_redis_client() -> Iterator[None]:
    """redis_get() caches its client: drop it around a test that points REDIS_URL elsewhere."""
    redis_get.cache_clear()
    yield
    redis_get.cache_clear()


def test_healthz_is_200_without_touching_dependencies() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_200_with_database_and_redis_ok() -> None:
    response = Client().get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_redis_client")
def test_readyz_is_503_when_redis_does_not_answer() -> None:
    # port 1 on localhost: nothing listens, the connection is refused at once
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("error: ")
