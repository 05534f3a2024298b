"""Rate limits (leaderboard/ratelimit.py): public reads per client address from one token
bucket in Redis that both read front ends share, 429 `rate_limited` with Retry-After;
the forwarded address trusted only behind a TLS proxy; failing open without Redis; live
sockets per address per process; staff sign-in throttled per address and per user name,
with failed sign-ins counted outside the audit chain and a throttle audited once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import redis
from channels.testing.websocket import WebsocketCommunicator
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from config.asgi import application
from leaderboard import ratelimit
from leaderboard.api.fastpath import ReadFastPath
from leaderboard.views.rankview import reads as rankview_reads
from leaderboard.views.rankview import wire
from seasons.models import Season
from seasons.staff.accounts.services import login_failures_key
from tests.support import Events, apply_events, live_run, publish
from tests.support.staff_console import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_flushed")]
pytest_plugins = ["tests.support.staff_fixtures"]

TOP = "/v1/seasons/nowhere/leaderboard/top"


def _fast_get(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        async def behind(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError("the fast path handed a read on")

        transport = httpx.ASGITransport(app=ReadFastPath(behind, threads=1), client=("10.9.9.9", 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.get(url, headers=headers)

    return asyncio.run(go())


def _assert_limited(response: Any) -> None:
    assert response.status_code == 429, response.content[:200]
    body = response.json()
    assert body["error"] == "rate_limited" and body["retry_after"] >= 1
    assert response.headers["Retry-After"] == str(body["retry_after"])


def test_reads_past_the_bucket_are_429_with_retry_after_per_address(settings: Any) -> None:
    settings.READ_RATE_LIMIT = (1.0, 3)
    client = APIClient()
    for _ in range(3):
        assert client.get(TOP).status_code == 404  # an unknown season: answered, not limited
    _assert_limited(client.get(TOP))
    _assert_limited(client.get("/v1/seasons/nowhere/final"))  # FINAL reads share the bucket
    assert client.get(TOP, REMOTE_ADDR="10.0.0.2").status_code == 404  # another address, its own bucket


@pytest.mark.django_db(transaction=True)
def test_the_fast_read_path_and_the_views_share_one_bucket(settings: Any) -> None:
    settings.READ_RATE_LIMIT = (1.0, 2)
    assert _fast_get(TOP).status_code == 404
    assert APIClient().get(TOP, REMOTE_ADDR="10.9.9.9").status_code == 404
    _assert_limited(_fast_get(TOP))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_the_fast_paths_limit_rides_along_the_reads_first_round_trip(
        season_factory: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    season = season_factory(slug="ride")
    ev = Events(tag="ride")
    apply_events(season, [ev.result(f"p{i}", 100 + i) for i in range(5)])
    publish(season)
    trips: list[int] = []

    def counted(r: Any, commands: list[Any]) -> list[Any]:
        trips.append(len(commands))
        return wire.round_trip(r, commands)

    # The first current top of a version in a process reads its names on a read thread;
    # the ones after it read them with the pointer, on the event loop.
    assert _fast_get("/v1/seasons/ride/leaderboard/top").status_code == 200
    monkeypatch.setattr(rankview_reads, "round_trip", counted)
    monkeypatch.setattr(ratelimit, "round_trip", counted)
    settings.READ_RATE_LIMIT = (1.0, 3)
    rank = "/v1/seasons/ride/players/p2/rank"
    assert _fast_get(rank).json()["rank"] == 3
    assert len(trips) == 2, trips  # the pointer and lookup with the limit's token, then the place
    # The top: the pointer and the token in one round trip, on the event loop.
    assert _fast_get("/v1/seasons/ride/leaderboard/top").status_code == 200
    assert len(trips) == 2, trips
    # A read refused before any round trip takes its token in one of its own: the bucket of
    # 3 is empty after these three reads.
    assert _fast_get("/v1/seasons/ride/players/p2/neighbors?radius=x").status_code == 400
    _assert_limited(_fast_get(rank))
    _assert_limited(_fast_get("/v1/seasons/ride/players/nobody/rank"))  # over the limit: not the 404
    settings.READ_RATE_LIMIT = None
    assert _fast_get(rank).status_code == 200


def test_the_forwarded_address_counts_only_behind_a_tls_proxy(settings: Any) -> None:
    settings.READ_RATE_LIMIT = (1.0, 1)
    client = APIClient()
    settings.BEHIND_TLS_PROXY = False
    assert client.get(TOP, HTTP_X_FORWARDED_FOR="1.1.1.1").status_code == 404
    _assert_limited(client.get(TOP, HTTP_X_FORWARDED_FOR="2.2.2.2"))  # a claim, not an address
    settings.BEHIND_TLS_PROXY = True
    # The proxy appends the address it saw; what the client put before it is not trusted.
    assert client.get(TOP, HTTP_X_FORWARDED_FOR="9.9.9.9, 3.3.3.3").status_code == 404
    _assert_limited(client.get(TOP, HTTP_X_FORWARDED_FOR="4.4.4.4, 3.3.3.3"))
    assert client.get(TOP, HTTP_X_FORWARDED_FOR="5.5.5.5").status_code == 404


def test_the_limit_fails_open_when_redis_is_unreachable(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.READ_RATE_LIMIT = (1.0, 1)
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    monkeypatch.setattr(ratelimit, "redis_reads_get", lambda: dead)
    for _ in range(3):
        ratelimit.read_rate_check(address="10.0.0.1")


def test_off_is_no_limit(settings: Any) -> None:
    settings.READ_RATE_LIMIT = None
    client = APIClient()
    assert all(client.get(TOP).status_code == 404 for _ in range(20))


@pytest.mark.django_db(transaction=True)
def test_live_sockets_are_limited_per_address_in_each_process(season: Season, settings: Any) -> None:
    settings.LIVE_SOCKETS_PER_ADDRESS = 1
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]

    async def body() -> None:
        first = WebsocketCommunicator(application, f"/ws/v1/seasons/{season.slug}/live", headers=headers)
        assert (await first.connect(timeout=10))[0]
        await first.receive_json_from(timeout=10)  # its snapshot (or "unavailable")
        second = WebsocketCommunicator(application, f"/ws/v1/seasons/{season.slug}/live", headers=headers)
        assert (await second.connect(timeout=10))[0]
        refusal = await second.receive_json_from(timeout=10)
        assert refusal["error"] == "rate_limited"
        close = await second.receive_output(timeout=10)
        assert close["type"] == "websocket.close" and close["code"] == 4429
        await second.disconnect()
        await first.disconnect()
        third = WebsocketCommunicator(application, f"/ws/v1/seasons/{season.slug}/live", headers=headers)
        assert (await third.connect(timeout=10))[0]
        assert (await third.receive_json_from(timeout=10)).get("error") != "rate_limited"
        await third.disconnect()

    live_run(body)
    assert ratelimit.live_sockets.enter("127.0.0.1")  # every socket left the count
    ratelimit.live_sockets.leave("127.0.0.1")


def test_sign_in_is_throttled_per_address_and_the_throttle_audited_once(settings: Any, make_staff: Any) -> None:
    settings.LOGIN_RATE_LIMIT = (1 / 60, 3)
    make_staff("viewer", "vic")
    client = Client()
    for _ in range(3):
        wrong = client.post("/staff/login/", {"username": "vic", "password": "nope"})
        assert wrong.status_code == 200 and b"Wrong username or password" in wrong.content
    for username in ("vic", "someone-else", "vic"):
        refused = client.post("/staff/login/", {"username": username, "password": PASSWORD})
        assert refused.status_code == 429 and b"Too many sign-in attempts" in refused.content
        assert int(refused["Retry-After"]) >= 1
    assert "_auth_user_id" not in client.session  # even the right password did not sign in
    throttled = AuditEntry.objects.filter(action="auth.login.throttled")
    # One row per bucket that ran dry in this window (the address; then user name "vic"), not one per try.
    assert sorted(throttled.values_list("after__by", flat=True)) == ["address", "username"]


def test_sign_in_is_throttled_per_user_name_from_any_address(settings: Any, make_staff: Any) -> None:
    settings.LOGIN_RATE_LIMIT = (1 / 60, 2)
    make_staff("viewer", "vic")
    for n in range(2):
        assert Client(REMOTE_ADDR=f"10.0.0.{n}").post("/staff/login/", {"username": "vic", "password": "x"}
                                                      ).status_code == 200
    assert Client(REMOTE_ADDR="10.0.0.9").post("/staff/login/", {"username": "VIC", "password": PASSWORD}
                                               ).status_code == 429


def test_failed_sign_ins_are_counted_outside_the_audit_chain(settings: Any, make_staff: Any,
                                                             redis_flushed: Any) -> None:
    make_staff("viewer", "vic")
    before = AuditEntry.objects.count()
    for _ in range(5):
        assert Client().post("/staff/login/", {"username": "vic", "password": "nope"}).status_code == 200
    assert AuditEntry.objects.count() == before  # no chained row per failure
    # SCAN, not KEYS: a cluster client sends KEYS to one node, SCAN to every master.
    (key,) = redis_flushed.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}:auth:failed:*")
    assert key.decode() == login_failures_key(int(time.time()) // 3600)
    assert redis_flushed.hgetall(key) == {b"127.0.0.1|vic": b"5"}
    assert redis_flushed.ttl(key) > 0
