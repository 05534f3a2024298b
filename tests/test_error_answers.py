"""Refusals and error answers: one base class for the domain's refusals, one body for every
API error (reads, writes, the live socket), range messages that say "out of range", the
401 in the project's words, and each 4xx logged once."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import redis
import redis.asyncio
from rest_framework.test import APIClient

from leaderboard.api.errors import api_exception_handler
from leaderboard.core.buckets import LayoutError
from leaderboard.core.errors import DomainError
from leaderboard.core.events import BatchTooLarge, EventValidationError
from leaderboard.core.lifecycle import TransitionError
from leaderboard.live.messages import unavailable_message
from leaderboard.live.redis_async import pipeline_raw
from leaderboard.recovery.rebuild import RebuildError
from seasons.models import Season
from seasons.services import FinalNotReady, SeasonError
from seasons.staff.common import StaffError

ROOT = Path(__file__).resolve().parent.parent
BIGINT_RANGE = "1..9223372036854775807 (the largest 64-bit integer)"

Post = Callable[..., Any]


# --- one base class for the domain's refusals -----------------------------------------------


@pytest.mark.parametrize(
    "refusal",
    [LayoutError, TransitionError, SeasonError, FinalNotReady, StaffError, RebuildError,
     EventValidationError, BatchTooLarge],
)
def test_every_domain_refusal_derives_from_the_one_base_with_its_own_code(refusal: type[Exception]) -> None:
    assert issubclass(refusal, DomainError)
    assert not issubclass(refusal, (ValueError, RuntimeError))
    assert refusal.code != DomainError.code  # type: ignore[attr-defined]


def test_a_refusal_escaping_an_api_view_is_its_4xx_body_not_a_500() -> None:
    response = api_exception_handler(SeasonError("a FINAL season cannot be approved"), {})
    assert response is not None
    assert response.status_code == 400
    assert response.data == {"error": "season_refused", "detail": "a FINAL season cannot be approved"}

    response = api_exception_handler(BatchTooLarge(1001), {})
    assert response is not None
    assert response.status_code == 413
    assert response.data["error"] == "payload_too_large"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_the_live_socket_and_the_read_api_say_the_same_unavailable(season: Season, settings: Any) -> None:
    settings.EPOCH_SECONDS = 2.5  # a retry_after that rounds down but must round up: the next epoch
    response = APIClient().get(f"/v1/seasons/{season.slug}/leaderboard/top")
    assert response.status_code == 503
    body = response.json()
    message = unavailable_message(season.slug, None, None)
    assert body["retry_after"] == message["retry_after"] == 3
    assert response["Retry-After"] == "3"
    assert message["type"] == body["error"] == "unavailable"
    assert message["detail"].startswith(body["detail"])


# --- range messages and wording -------------------------------------------------------------


@pytest.mark.django_db
def test_score_version_beyond_64_bits_is_out_of_range_naming_the_bigint_bound(
    season: Season, api: APIClient, event_factory: Callable[..., dict[str, Any]]
) -> None:
    # 2**70 written as a JSON integer: the parser (orjson) reads it as a float.
    raw = api.post(f"/internal/v1/seasons/{season.slug}/scores:apply",
                   data=b'{"event_id": "e1", "match_id": "m1", "player_id": "p1", "best_score": 10, '
                        b'"score_version": 1180591620717411303424, "completed_at": "2026-11-15T12:00:00Z"}',
                   content_type="application/json")
    assert raw.status_code == 400
    assert raw.json()["fields"] == {"score_version": [f"out of range: must be in {BIGINT_RANGE}"]}
    # Every numeric field of the write API says so the same way.
    too_high = api.post(f"/internal/v1/seasons/{season.slug}/scores:apply",
                        event_factory(best_score=2**70, score_version=2**63), format="json")
    assert too_high.json()["fields"] == {
        "best_score": ["out of range: must be in 0..1000000"],
        "score_version": [f"out of range: must be in {BIGINT_RANGE}"],
    }
    not_a_number = api.post(f"/internal/v1/seasons/{season.slug}/scores:apply",
                            event_factory(best_score="10"), format="json")
    assert not_a_number.json()["fields"] == {"best_score": ["must be an integer in 0..1000000"]}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_bad_read_parameter_names_its_range_and_claims_no_write(season: Season) -> None:
    client = APIClient()
    url = f"/v1/seasons/{season.slug}/leaderboard"
    cases = {
        "limit=0": {"limit": ["out of range: must be in 1..100"]},
        "limit=abc": {"limit": ["must be an integer in 1..100"]},
        f"version={2**70}": {"version": [f"out of range: must be in {BIGINT_RANGE}"]},
        f"from_position={'9' * 5000}": {"from_position": [f"out of range: must be in {BIGINT_RANGE}"]},
    }
    for query, fields in cases.items():
        response = client.get(f"{url}?{query}")
        assert response.status_code == 400, query
        body = response.json()
        assert body["fields"] == fields, query
        assert body["detail"] == "the request is invalid", query


@pytest.mark.django_db
def test_an_invalid_write_says_nothing_was_written(
    season: Season, post_scores: Post, event_factory: Callable[..., dict[str, Any]]
) -> None:
    response = post_scores(season.slug, event_factory(score_version=0))
    assert response.status_code == 400
    assert response.json()["detail"] == "the request is invalid; nothing was written"


# --- 401 -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_write_without_a_token_gets_the_projects_401_body_and_a_bearer_challenge(
    season: Season, event_factory: Callable[..., dict[str, Any]]
) -> None:
    response = APIClient().post(f"/internal/v1/seasons/{season.slug}/scores:apply", event_factory(), format="json")
    assert response.status_code == 401
    assert response.json() == {
        "error": "unauthenticated", "detail": "an API token is required: send 'Authorization: Bearer <token>'",
    }
    assert response["WWW-Authenticate"].startswith("Bearer ")


# --- logging -------------------------------------------------------------------------------

_REQUEST_A_MISSING_PAGE = """
import django
django.setup()
from django.test import Client
assert Client().get("/no-such-page").status_code == 404
"""


def test_a_4xx_through_django_is_logged_once() -> None:
    """In a process of its own: the logging the settings configure, on a developer's
    machine (DEBUG on), where Django's default config adds a console handler of its own."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "true"}
    done = subprocess.run([sys.executable, "-c", _REQUEST_A_MISSING_PAGE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Not Found: /no-such-page") == 1, done.stderr


# --- a Redis Cluster with no node answering -------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the fast path reads the database from a thread
@pytest.mark.parametrize("client_made", ["before the stop", "after the stop"])
def test_a_cluster_with_every_node_stopped_answers_503_on_both_read_paths(
        season: Season, settings: Any, client_made: str) -> None:
    """Every node of the rank views' Redis Cluster stopped: the fast read path and the DRF
    views answer 503 with Retry-After, never 500, whether the process's cluster client was
    made while the cluster ran (its slot map names nodes that no longer answer, and no node
    answers the map's refresh) or is made now (no node to discover the cluster from)."""
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from tests.support.cluster import cluster_start, cluster_stop
    from tests.support.publication import fast_get

    cluster = cluster_start(masters=3)
    try:
        settings.REDIS_CLUSTER, settings.REDIS_URL = True, cluster.url
        redis_get.cache_clear()
        rankview.manifest_cache_clear()
        if client_made == "before the stop":
            redis_get().ping()
        for port in cluster.ports:
            cluster.master_kill(port)
        for url in (f"/v1/seasons/{season.slug}/leaderboard/top", f"/v1/seasons/{season.slug}/leaderboard?from=1",
                    f"/v1/seasons/{season.slug}/players/p1/rank", f"/v1/seasons/{season.slug}/players/p1/neighbors",
                    f"/v1/seasons/{season.slug}/players/p1/rank?version=1"):
            for path, response in (("fast", fast_get(url)), ("drf", APIClient().get(url))):
                assert response.status_code == 503, (path, url, response.status_code, response.content[:300])
                assert response.json()["error"] == "unavailable", (path, url)
                assert response.headers["Retry-After"], (path, url)

        async def live_round(port: int) -> None:
            # A node's URL where nothing answers: the live boards' own (asyncio) client finds
            # no node either.
            client = redis.asyncio.RedisCluster.from_url(f"redis://127.0.0.1:{port}")
            try:
                await pipeline_raw(cast(redis.asyncio.Redis, client), [("GET", "x")])
            finally:
                await client.aclose()

        # Not the stopped nodes' ports: a cluster another test session starts at once may
        # take them. A port held bound and never listening refuses, and nobody can take it.
        with socket.socket() as held, pytest.raises(redis.exceptions.ConnectionError):
            held.bind(("127.0.0.1", 0))
            asyncio.run(live_round(held.getsockname()[1]))
    finally:
        redis_get.cache_clear()
        rankview.manifest_cache_clear()
        cluster_stop(cluster)


# --- paths that name no operation, and methods the probes do not take --------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/seasons/x/leaderbord/top"),
    ("GET", "/v1/seasons/acceptance/players/a%2Fb/rank"),
    ("GET", "/v1/seasons/acceptance/players/a%2Fb/neighbors"),
    ("GET", "/v1/nothing"),
    ("POST", "/internal/v1/nothing"),
    ("DELETE", "/v1/"),
])
def test_an_api_path_that_names_no_operation_is_the_json_404(method: str, path: str) -> None:
    """Under /v1/ and /internal/ every answer is the API's JSON, whatever the path: a typo,
    or an id whose encoded '/' split the path, is not Django's HTML page (nor, for a POST,
    its CSRF page)."""
    from django.test import Client

    response = Client(enforce_csrf_checks=True).generic(method, path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"] == "not_found"


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path", "field"), [
    ("PUT", "/internal/v1/players/a%2Fb/friends", "player_id"),
    ("POST", "/internal/v1/seasons/a%2Fb/scores:apply", "season_id"),
])
def test_an_id_with_an_encoded_slash_in_a_write_url_is_a_400_naming_the_field(
        method: str, path: str, field: str) -> None:
    from leaderboard.api_clients import api_client_create
    from tests.support import TEST_ACTOR

    _client, token = api_client_create(name="writer", scopes=["social:write", "scores:write"], actor=TEST_ACTOR)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"friends": [], "graph_version": 1} if field == "player_id" else {"events": []}
    response = api.generic(method, path, data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == [field]


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_the_probes_answer_another_method_with_the_json_405(path: str) -> None:
    from django.test import Client

    response = Client().post(path)
    assert response.status_code == 405
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD"
