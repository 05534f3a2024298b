"""The live boards' channel layer Redis hangs instead of refusing (it accepts connections
and answers nothing): epochs keep their pace (each announcement gives up within
LIVE_ANNOUNCE_TIMEOUT_SECONDS, and later ones are skipped for a while instead of each
waiting its timeout), the sockets already open keep getting every version within
VIEWS_CHECK_SECONDS from their server's own check of the season's pointer, every board a
client rebuilds from its messages is the ledger's at that version (a diff only on the
version it was sent against, else the full top), and once the layer answers again the
announcements reach the group by themselves. A real server process behind a proxy that
stops forwarding (tests/support/stall.py); the epochs run in this process, as a worker's."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels_redis.core import RedisChannelLayer
from websockets.asyncio.client import connect
from websockets.typing import Origin

from leaderboard.core.live import top_apply
from leaderboard.live import announce
from leaderboard.live.announce import season_group
from leaderboard.live.hub import VIEWS_CHECK_SECONDS
from seasons.models import Season
from tests.support import Events, apply_events, db_standings, publish
from tests.support.browser import asgi_server
from tests.support.reference import answer_entry
from tests.support.stall import stall_proxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views"), pytest.mark.slow]

CLIENTS = 4
ANNOUNCE_TIMEOUT = 0.3
HANG_SECONDS = 6.0
# What a version may take to reach the sockets while the layer hangs: the server's check
# of the pointer, plus its round and a scheduling margin on a busy machine.
HUNG_DELIVERY_SECONDS = VIEWS_CHECK_SECONDS + 2.0


class Clients:
    """CLIENTS websockets on one asyncio loop in a thread: each rebuilds its top from the
    messages (a full top, or a diff that must be against the version it holds) and
    records (version, top, arrival time)."""

    def __init__(self, url: str, origin: str) -> None:
        self.url, self.origin = url, origin
        self.seen: list[list[tuple[int, list[dict[str, Any]], float]]] = [[] for _ in range(CLIENTS)]
        self.errors: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)
        self.thread.start()
        assert self.ready.wait(20), "the clients did not connect"

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        sockets = [await connect(self.url, origin=Origin(self.origin)) for _ in range(CLIENTS)]
        self.ready.set()
        readers = [asyncio.ensure_future(self._read(i, ws)) for i, ws in enumerate(sockets)]
        await self._stop.wait()
        for reader in readers:
            reader.cancel()
        for ws in sockets:
            await ws.close()

    async def _read(self, index: int, ws: Any) -> None:
        import orjson

        top: list[dict[str, Any]] | None = None
        held: int | None = None
        async for raw in ws:
            message = orjson.loads(raw)
            if message.get("type") not in ("snapshot", "version"):
                continue
            version = int(message["leaderboard_version"])
            if "top" in message:
                top = message["top"]
            else:
                diff = message["top_diff"]
                if top is None or diff["base_version"] != held:
                    self.errors.append(f"client {index}: a diff against v{diff['base_version']} while "
                                       f"holding v{held}")
                    return
                top = top_apply(top, diff)
            held = version
            self.seen[index].append((version, top, time.monotonic()))

    def latest(self) -> int:
        return min((seen[-1][0] if seen else 0) for seen in self.seen)

    def wait_for(self, version: int, within: float) -> float:
        """Seconds until every client holds `version` (or a later one)."""
        started = time.monotonic()
        while self.latest() < version:
            assert not self.errors, self.errors
            assert time.monotonic() - started < within, (
                f"v{version} not on every client within {within:g} s: {[s[-1][0] if s else None for s in self.seen]}")
            time.sleep(0.02)
        return time.monotonic() - started

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)


def test_live_boards_keep_moving_and_epochs_keep_their_pace_while_the_channel_layer_hangs(
        season_factory: Callable[..., Season], settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(announce, "_quiet_until", 0.0)  # put back after the test
    season = season_factory(slug="layerhang")
    events = Events(tag="layerhang")
    expected: dict[int, list[dict[str, Any]]] = {}
    step = 0

    def epoch() -> tuple[int, float]:
        nonlocal step
        step += 1
        apply_events(season, [events.result(f"p{(step * 7 + i) % 150:03d}", 1000 + step * 13 + i)
                              for i in range(5)])
        started = time.monotonic()
        version = publish(season)
        took = time.monotonic() - started
        expected[version] = [answer_entry(e) for e in db_standings(season).top(100)]
        return version, took

    apply_events(season, [events.result(f"p{i:03d}", 1000 + i) for i in range(150)])
    version, _ = epoch()

    url = urlsplit(settings.CHANNEL_LAYER_URLS[0])
    with stall_proxy(target_port=url.port or 6379) as proxy:
        proxied = urlunsplit(url._replace(netloc=f"{url.hostname}:{proxy.port}"))
        layers = settings.CHANNEL_LAYERS["default"]
        settings.CHANNEL_LAYERS = {"default": {**layers, "CONFIG": {
            **layers["CONFIG"], "hosts": [{**layers["CONFIG"]["hosts"][0], "address": proxied}]}}}
        settings.LIVE_ANNOUNCE_TIMEOUT_SECONDS = ANNOUNCE_TIMEOUT
        with asgi_server(CHANNEL_LAYER_URL=proxied) as base:
            clients = Clients(f"ws{base.removeprefix('http')}/ws/v1/seasons/layerhang/live", base)
            try:
                clients.wait_for(version, 10)
                answering = [epoch() for _ in range(3)]
                clients.wait_for(answering[-1][0], 5)
                normal = max(took for _, took in answering)

                proxy.stall_all()
                hung: list[tuple[int, float]] = []
                delays: list[float] = []
                started = time.monotonic()
                while time.monotonic() - started < HANG_SECONDS:
                    hung.append(epoch())
                    delays.append(clients.wait_for(hung[-1][0], HUNG_DELIVERY_SECONDS))
                slowest = max(took for _, took in hung)
                print(f"channel layer hung {HANG_SECONDS:g} s: {len(hung)} epochs (slowest publish {slowest:.2f} s, "
                      f"{normal:.2f} s before the hang), each on {CLIENTS} clients after at most "
                      f"{max(delays):.2f} s")
                # The first announcement waits out its timeout; those after it are skipped.
                assert slowest <= normal + ANNOUNCE_TIMEOUT + 1.0, (slowest, normal)
                assert sum(took for _, took in hung[1:]) / max(len(hung) - 1, 1) <= normal + 0.5, hung

                proxy.thaw()
                # This test's own member of the group, on the layer's Redis without the proxy.
                version = _announced_again(RedisChannelLayer(**layers["CONFIG"]), epoch)
                clients.wait_for(version, 5)
                assert not clients.errors, clients.errors
            finally:
                clients.close()

    for index, seen in enumerate(clients.seen):
        versions = [v for v, _, _ in seen]
        assert versions == sorted(set(versions)), (index, versions)
        for version, top, _ in seen:
            assert top == expected[version], (index, version)


def _announced_again(layer: Any, epoch: Callable[[], tuple[int, float]]) -> int:
    """Run epochs (their announcements through the proxied layer of this process) until one
    is heard in the season's group; its version."""
    async def body() -> int:
        channel = await layer.new_channel("check")
        await layer.group_add(season_group("layerhang"), channel)
        deadline = time.monotonic() + 2 * announce.ANNOUNCE_QUIET_SECONDS + 5
        while True:
            assert time.monotonic() < deadline, "announcements did not come back once the layer answered"
            version, _ = await sync_to_async(epoch)()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    while (await layer.receive(channel)).get("version") != version:
                        pass
                    return version

    return async_to_sync(body)()
