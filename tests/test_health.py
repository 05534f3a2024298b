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


# --- who may see the internals: /metrics and the details of /readyz ----------------------

PUBLIC = "203.0.113.7"  # a documentation address: any client off this host


@pytest.mark.django_db
def test_readyz_answers_the_public_with_the_status_alone() -> None:
    response = Client().get("/readyz", REMOTE_ADDR=PUBLIC)
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_redis_client")
def test_readyz_tells_the_public_it_is_unavailable_without_saying_why() -> None:
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        response = Client().get("/readyz", REMOTE_ADDR=PUBLIC)
    assert (response.status_code, response.json()) == (503, {"status": "unavailable"})


@pytest.mark.django_db
def test_metrics_refuse_a_client_off_this_host_without_a_token() -> None:
    response = Client().get("/metrics", REMOTE_ADDR=PUBLIC)
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"


@pytest.mark.django_db
def test_metrics_refuse_a_loopback_request_a_proxy_forwarded() -> None:
    response = Client().get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert response.status_code == 403


@pytest.mark.django_db
def test_with_a_metrics_token_only_its_bearer_sees_metrics_and_readiness_details() -> None:
    with override_settings(METRICS_TOKEN="s3cret-scrape-token"):
        assert Client().get("/metrics").status_code == 403  # loopback is not enough any more
        assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
        scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token", REMOTE_ADDR=PUBLIC)
        assert scraped.status_code == 200
        assert scraped["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert Client().get("/readyz").json() == {"status": "ok"}
        detailed = Client().get("/readyz", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token", REMOTE_ADDR=PUBLIC)
        assert detailed.json() == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "TRACE", "QUERY"])
def test_probes_answer_other_methods_405_with_allow(path: str, method: str) -> None:
    # The fuzzer's finds: TRACE /healthz was a 200 and QUERY the CSRF check's 403 page,
    # answers the schema (GET only) does not describe.
    response = Client(enforce_csrf_checks=True).generic(method, path)
    assert response.status_code == 405
    assert set(response["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}
