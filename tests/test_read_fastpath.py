"""The fast read path (leaderboard/api/fastpath.py): the read URLs answered from ASGI give
exactly what the DRF views give, keep Django's host check and security headers, and hand
every other request to the application behind them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from rest_framework.test import APIClient

from leaderboard.api.fastpath import ReadFastPath
from seasons.models import Season
from tests.support import NARROW, Events, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


class Behind:
    """The application behind the fast path: records what it was handed."""

    def __init__(self) -> None:
        self.paths: list[tuple[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"behind"})


def fetch(app: Any, method: str, url: str, host: str = "testserver") -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as client:
            return await client.request(method, url)

    return asyncio.run(go())


@pytest.fixture
def published(season_factory: Callable[..., Season], post_scores: Post) -> Season:
    season = season_factory(slug="fast", layout=NARROW)
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", (i * 37) % 1000) for i in range(40)]
            + [ev.result(f"tie{i}", 500) for i in range(5)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p03", 999)])
    publish(season)
    return season


URLS = [
    "/v1/seasons/fast/leaderboard/top",
    "/v1/seasons/fast/leaderboard/top?limit=3",
    "/v1/seasons/fast/leaderboard/top?limit=0",
    "/v1/seasons/fast/leaderboard?from_position=4&limit=5",
    "/v1/seasons/fast/leaderboard?from_position=x",
    "/v1/seasons/fast/players/p03/rank",
    "/v1/seasons/fast/players/tie2/rank?version=1",
    "/v1/seasons/fast/players/tie2/rank?version=99",
    "/v1/seasons/fast/players/p05/rank?include_pending=true",
    "/v1/seasons/fast/players/p05/rank?include_pending=maybe",
    "/v1/seasons/fast/players/nobody/rank",
    "/v1/seasons/fast/players/bad%20id/rank",
    "/v1/seasons/fast/players/tie0/neighbors?radius=3",
    "/v1/seasons/fast/players/tie0/neighbors?radius=11",
    "/v1/seasons/unknown/players/p03/rank",
]


@pytest.mark.parametrize("url", URLS)
def test_each_read_answers_exactly_as_the_drf_view_does(published: Season, url: str) -> None:
    behind = Behind()
    fast = fetch(ReadFastPath(behind), "GET", url)
    slow = APIClient().get(url)
    assert behind.paths == [], "the fast path handed a read URL on"
    assert fast.status_code == slow.status_code, (url, fast.content, slow.content)
    assert orjson.loads(fast.content) == orjson.loads(slow.content)
    assert fast.headers["content-type"] == "application/json"


def test_a_season_without_a_version_answers_503_with_retry_after(season_factory: Callable[..., Season]) -> None:
    season_factory(slug="empty")
    response = fetch(ReadFastPath(Behind()), "GET", "/v1/seasons/empty/leaderboard/top")
    assert response.status_code == 503
    assert response.json()["error"] == "unavailable"
    assert int(response.headers["retry-after"]) >= 1


def test_answers_carry_djangos_security_headers(published: Season) -> None:
    response = fetch(ReadFastPath(Behind()), "GET", "/v1/seasons/fast/players/p03/rank")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "same-origin"


def test_other_methods_paths_and_hosts_go_to_the_application_behind(published: Season, settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["leaderboard.example"]
    behind = Behind()
    app = ReadFastPath(behind)
    assert fetch(app, "GET", "/v1/seasons/fast/leaderboard/top", host="leaderboard.example").status_code == 200
    assert fetch(app, "GET", "/v1/seasons/fast/leaderboard/top", host="evil.example").status_code == 299
    assert fetch(app, "POST", "/v1/seasons/fast/leaderboard/top", host="leaderboard.example").status_code == 299
    assert fetch(app, "GET", "/v1/seasons/fast/final", host="leaderboard.example").status_code == 299
    assert fetch(app, "GET", "/healthz", host="leaderboard.example").status_code == 299
    assert behind.paths == [("GET", "/v1/seasons/fast/leaderboard/top"), ("POST", "/v1/seasons/fast/leaderboard/top"),
                            ("GET", "/v1/seasons/fast/final"), ("GET", "/healthz")]


def test_the_benchmark_baseline_answers_the_same_through_both_redis_client_paths(db: Any, settings: Any) -> None:
    from leaderboard.api.baseline_views import baseline_key
    from leaderboard.redis_client import redis_get

    settings.BENCH_BASELINE = True
    redis_get().zadd(baseline_key("b"), {"a": 30, "b": 20, "c": 20})
    app = ReadFastPath(Behind())
    pipelined = fetch(app, "GET", "/bench/baseline/seasons/b/players/c/rank")
    lean = fetch(app, "GET", "/bench/baseline/seasons/b/players/c/rank?client=lean")
    assert pipelined.status_code == lean.status_code == 200
    assert pipelined.json() == lean.json() == {"player_id": "c", "total_players": 3, "score": 20, "rank": 2,
                                               "position": 2}
    assert fetch(app, "GET", "/bench/baseline/seasons/b/players/zz/rank?client=lean").status_code == 404


def test_the_current_top_is_served_on_the_event_loop_without_a_read_thread(
        published: Season, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    from leaderboard.api import fastpath

    settings.READ_RATE_LIMIT = (1000.0, 1000)
    threads: list[str] = []
    answer = fastpath._answer

    def counted(*args: Any) -> Any:
        threads.append(args[2].string)
        return answer(*args)

    monkeypatch.setattr(fastpath, "_answer", counted)
    app = ReadFastPath(Behind(), threads=1)
    fetch(app, "GET", "/v1/seasons/fast/leaderboard/top?version=2")  # reads the manifest into this process
    # The first current top of a version in a process reads its names on a read thread;
    # later ones read them with the pointer.
    fetch(app, "GET", "/v1/seasons/fast/leaderboard/top")
    assert threads == ["/v1/seasons/fast/leaderboard/top"] * 2
    threads.clear()
    for url in ("/v1/seasons/fast/leaderboard/top", "/v1/seasons/fast/leaderboard/top?limit=3"):
        response = fetch(app, "GET", url)
        assert response.status_code == 200
        assert response.json() == APIClient().get(url).json()
    assert threads == []
    # What needs more than the pointer goes to a read thread, answered as before.
    for url in ("/v1/seasons/fast/leaderboard/top?version=1", "/v1/seasons/fast/leaderboard/top?limit=0",
                "/v1/seasons/nowhere/leaderboard/top"):
        assert fetch(app, "GET", url).json() == APIClient().get(url).json()
    assert len(threads) == 3, threads
