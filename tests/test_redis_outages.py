"""The one list of Redis outages (leaderboard/redis_errors.py), against a server that
answers what a node says during a failover: a read is a 503, a wrong password is still the
sign-in form, a committed batch is still its 200; never a 500."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.test import Client, override_settings
from redis.exceptions import RedisClusterException
from rest_framework.test import APIClient

from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_ERRORS, REDIS_OUTAGES
from seasons.models import Season
from tests.support import Events
from tests.support.failure import redis_answering_errors

pytest_plugins = ["tests.support.staff_fixtures"]

# What a node answers between a master's failure and its replica's promotion, after a
# demotion, and while it loads its data after a restart.
FAILOVER_ANSWERS = [
    "CLUSTERDOWN The cluster is down",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "READONLY You can't write against a read only replica.",
    "LOADING Redis is loading the dataset in memory",
]


@pytest.fixture(params=FAILOVER_ANSWERS, ids=["clusterdown", "tryagain", "readonly", "loading"])
def failing_redis(request: pytest.FixtureRequest) -> Iterator[str]:
    with redis_answering_errors(request.param) as url, override_settings(REDIS_URL=url):
        redis_get.cache_clear()
        try:
            yield request.param
        finally:
            redis_get.cache_clear()


def test_every_class_the_cluster_client_raises_is_in_the_one_list() -> None:
    # RedisClusterException is no RedisError: a handler of RedisError alone lets it through.
    assert not issubclass(RedisClusterException, redis.RedisError)
    assert RedisClusterException in REDIS_OUTAGES and RedisClusterException in REDIS_ERRORS
    for klass in (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
                  redis.exceptions.ReadOnlyError, redis.exceptions.BusyLoadingError,
                  redis.exceptions.SlotNotCoveredError, redis.exceptions.MasterDownError):
        assert issubclass(klass, REDIS_ERRORS), klass
    for klass in (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
                  redis.exceptions.ReadOnlyError, redis.exceptions.BusyLoadingError,
                  redis.exceptions.SlotNotCoveredError):
        assert issubclass(klass, REDIS_OUTAGES), klass


@pytest.mark.django_db
def test_a_read_during_a_failover_is_a_503_with_retry_after(season: Season, failing_redis: str) -> None:
    response = APIClient().get(f"/v1/seasons/{season.slug}/players/p1/rank")
    assert response.status_code == 503, (failing_redis, response.content)
    assert response.json()["error"] == "unavailable"
    assert response["Retry-After"]


@pytest.mark.django_db
def test_a_wrong_password_during_a_failover_is_the_sign_in_form_again(make_staff: Any, failing_redis: str) -> None:
    make_staff("viewer", "vic")
    response = Client().post("/staff/login/", {"username": "vic", "password": "nope"})
    assert response.status_code == 200, failing_redis
    assert b"password" in response.content.lower()


@pytest.mark.django_db(transaction=True)
def test_a_batch_committed_during_a_failover_is_its_200(season: Season, post_scores: Callable[..., Any],
                                                         failing_redis: str) -> None:
    """The outcomes are counted in Redis after the commit: that failing is logged, and the
    client is told what was written."""
    events = Events(season.slug)
    response = post_scores(season.slug, {"events": [events.result("p1", 10)]})
    assert response.status_code == 200, (failing_redis, response.content)
    assert [o["status"] for o in response.json()["results"]] == ["applied"]
