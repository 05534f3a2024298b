"""A Redis that hangs instead of refusing (it accepts connections and answers nothing): the
server's reads answer 503 within about twice READ_REDIS_TIMEOUT_SECONDS, those arriving
meanwhile at once (the process knows of the outage and lets one read a second through to
find out), the process opens no pile of connections, and once Redis answers again the
reads answer 200 by themselves. A real server process; the hang is a proxy in front of
Redis that stops forwarding (tests/support/stall.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from django.conf import settings as django_settings

from seasons.models import Season
from tests.support import Events, apply_events, publish
from tests.support.browser import asgi_server
from tests.support.stall import stall_proxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views"), pytest.mark.slow]

READ_TIMEOUT = 0.5
THREADS = 2
# A read's rate limit and its own first round trip each wait out the timeout at most.
BOUND_SECONDS = 2 * READ_TIMEOUT + 1.5
HANG_SECONDS = 4.0


def _timed_get(client: httpx.Client, path: str) -> tuple[int, str, float]:
    started = time.monotonic()
    response = client.get(path)
    body = response.json()
    return response.status_code, body.get("error", ""), time.monotonic() - started


def test_reads_answer_503_in_bounded_time_while_redis_hangs_and_come_back_by_themselves(
        season_factory: Callable[..., Season], settings: Any) -> None:
    if settings.REDIS_CLUSTER:
        pytest.skip("the proxy stands in front of one server")
    season = season_factory(slug="hang")
    events = Events(tag="hang")
    apply_events(season, [events.result(f"h{i:02d}", i * 10) for i in range(40)])
    publish(season)
    paths = [f"/v1/seasons/hang/players/h{i:02d}/rank" for i in range(40)] + ["/v1/seasons/hang/leaderboard/top"]
    url = urlsplit(django_settings.REDIS_URL)
    with stall_proxy(target_port=url.port or 6379) as proxy:
        proxied = urlunsplit(url._replace(netloc=f"{url.hostname}:{proxy.port}"))
        with (asgi_server(REDIS_URL=proxied, READ_THREADS=str(THREADS),
                          READ_REDIS_TIMEOUT_SECONDS=str(READ_TIMEOUT)) as base,
              httpx.Client(base_url=base, timeout=60) as client,
              ThreadPoolExecutor(max_workers=24) as pool):
            assert {status for status, _, _ in pool.map(lambda p: _timed_get(client, p), paths)} == {200}
            connections = proxy.accepted

            proxy.stall_all()
            hung: list[tuple[int, str, float]] = []
            started = time.monotonic()
            while time.monotonic() - started < HANG_SECONDS:
                hung += pool.map(lambda p: _timed_get(client, p), paths[:24])
            slowest = max(elapsed for _, _, elapsed in hung)
            opened = proxy.accepted - connections
            print(f"while Redis hung: {len(hung)} reads, statuses {sorted({s for s, _, _ in hung})}, "
                  f"slowest {slowest:.2f} s, {opened} connections opened")
            assert {(status, error) for status, error, _ in hung} == {(503, "unavailable")}
            assert slowest <= BOUND_SECONDS, slowest
            # Each read thread reconnects at most once per probe (about a second).
            assert opened <= THREADS * (HANG_SECONDS + 2), opened

            proxy.thaw()
            thawed = time.monotonic()
            while True:
                status, _, _ = _timed_get(client, paths[0])
                if status == 200:
                    break
                assert time.monotonic() - thawed < 10, "the reads did not come back once Redis answered"
                time.sleep(0.2)
            print(f"back {time.monotonic() - thawed:.2f} s after Redis answered again")
            assert {status for status, _, _ in pool.map(lambda p: _timed_get(client, p), paths)} == {200}
