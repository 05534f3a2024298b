"""Reads of the rank views on a real local Redis Cluster of 3 masters (config/local_cluster.py).

A version is published by the epoch on the Redis this session serves its rank views from:
on a cluster session (TEST_REDIS_CLUSTER=1) directly on the cluster; otherwise on the single
Redis, and its keys are then copied key by key (DUMP/RESTORE) onto a cluster this module
starts, the same names landing in their own slots. Every read is then compared with the
single Redis's answer (or the ledger's), and counted at the socket: a rank read is at most
two sequential round trips, each sent to every node it needs at once; a slot group written
between a read's round trips makes it retry."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import redis
import redis.asyncio

from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry
from leaderboard.core.slots import bucket_group
from leaderboard.live.players import PlayerRead, players_read, players_read_async
from leaderboard.redis_client import redis_cluster_of, redis_get
from leaderboard.views import rankview
from leaderboard.views.invariants import version_check
from leaderboard.views.rankview import reads as rank_reads
from seasons.models import Season
from tests.conftest import redis_flush
from tests.support.cluster import FailoverCluster, cluster_start, cluster_stop
from tests.support.publication import (
    NARROW,
    RoundTrips,
    current_manifest,
    fast_get,
    keys_of,
    publish,
    reader_of,
)
from tests.support.writes import Events, apply_events, db_standings

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

PLAYERS = [f"c{i:02d}" for i in range(60)]


@pytest.fixture(scope="module")
def started(request: pytest.FixtureRequest) -> Iterator[FailoverCluster | None]:
    """This module's own cluster, unless the session already serves the rank views from one."""
    from django.conf import settings

    if settings.REDIS_CLUSTER:
        yield None
        return
    cluster = cluster_start(masters=3)
    yield cluster
    cluster_stop(cluster)


@pytest.fixture
def on_cluster(started: FailoverCluster | None, season_factory: Callable[..., Season], rank_views: Any,
               settings: Any) -> Iterator[tuple[Season, redis.RedisCluster]]:
    """A season of 60 players with ties over 11 buckets, version 1 published and served
    from the cluster; the rank views' client is the cluster's."""
    season = season_factory(slug="cl", layout=NARROW)
    rnd = random.Random(15)
    events = Events("cl")
    apply_events(season, [events.result(p, rnd.choice([50, 120, 250, 250, 480, 700, 700, 930])) for p in PLAYERS])
    assert publish(season) == 1
    if started is not None:
        plain = redis_get()
        settings.REDIS_CLUSTER, settings.REDIS_URL = True, started.url
        redis_get.cache_clear()
        redis_flush(redis_get())
        for key in plain.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}:{{{season.slug}*", count=1000):
            dumped = plain.dump(key)
            assert isinstance(dumped, bytes)
            redis_get().restore(key, 0, dumped, replace=True)
    rankview.manifest_cache_clear()
    client = redis_cluster_of(redis_get())
    assert client is not None
    yield season, client
    if started is not None:
        redis_flush(client)
        redis_get.cache_clear()
    rankview.manifest_cache_clear()


def test_a_rank_read_is_two_round_trips_sent_to_every_node_at_once(
        on_cluster: tuple[Season, redis.RedisCluster], monkeypatch: pytest.MonkeyPatch) -> None:
    """And one when the player read last with the same score (the place hint): the
    place is read on its bucket's node in the lookup's round trip, and checked there."""
    season, client = on_cluster
    masters = {int(node.port) for node in client.get_primaries()}
    assert len(masters) == 3
    standings = db_standings(season)
    fast_get(f"/v1/seasons/{season.slug}/players/zz/rank")  # the manifest is cached per process
    spied = RoundTrips(monkeypatch, season)
    nodes_seen: set[int] = set()
    for player_id in PLAYERS:
        trips = spied.during(functools.partial(reader_of(season).rank, player_id))
        assert len(trips) == 2, (player_id, spied.nodes, trips)
        nodes_seen |= set().union(*spied.nodes)
        trips = spied.during(lambda: fast_get(f"/v1/seasons/{season.slug}/players/{player_id}/rank"))  # noqa: B023
        assert len(trips) == 1, (player_id, spied.nodes, trips)
        answer = fast_get(f"/v1/seasons/{season.slug}/players/{player_id}/rank").json()
        entry = standings.entry(player_id)
        assert entry is not None
        assert (answer["rank"], answer["position"], answer["score"]) == (entry.rank, entry.position, entry.score)
    # The copy's groups are spread over every master: the players' reads reach them all.
    assert nodes_seen == masters


def test_every_read_on_the_cluster_answers_as_the_ledger(on_cluster: tuple[Season, redis.RedisCluster]) -> None:
    season, client = on_cluster
    standings = db_standings(season)
    reader = reader_of(season)
    _, top = reader.window(1, len(PLAYERS))
    assert top == standings.window(from_position=1, limit=len(PLAYERS))
    for player_id in PLAYERS[::7]:
        _, me, around = reader.neighbors(player_id, 3)
        assert me == standings.entry(player_id)
        assert around == standings.neighbors(player_id, 3)
    friends = reader.players([*PLAYERS[:20], "nobody"])
    assert friends.ranks == {p: standings.rank_of(p) for p in PLAYERS[:20]}
    manifest = current_manifest(season)
    reads, trips = players_read(redis_get(), keys_of(season), manifest, {p: 2 for p in PLAYERS[::5]})
    assert trips <= 4
    for player_id, read in reads.items():
        assert read.entry == standings.entry(player_id)
        assert list(read.window) == standings.neighbors(player_id, 2)
    async def batched() -> tuple[dict[str, PlayerRead], int]:
        # The live boards' asyncio client, per node (pipeline_raw).
        from django.conf import settings

        # Typed as the plain client, as LiveRegistry.redis() hands it to the hubs.
        aclient = cast(redis.asyncio.Redis, redis.asyncio.RedisCluster.from_url(settings.REDIS_URL))
        try:
            return await players_read_async(aclient, keys_of(season), manifest, {p: 2 for p in PLAYERS[::5]})
        finally:
            await aclient.aclose()

    assert asyncio.run(batched()) == (reads, trips)
    report = version_check(r=redis_get(), keys=keys_of(season), full=True, sample=len(PLAYERS), seed=1)
    assert report.ok, report


def _bucket_fence(season: Season, player_id: str) -> tuple[Manifest, Entry, str]:
    """The current manifest, the player's entry in the ledger and its bucket's group fence key."""
    manifest = current_manifest(season)
    entry = db_standings(season).entry(player_id)
    assert entry is not None
    bucket = manifest.layout.bucket_of(entry.score)
    return manifest, entry, keys_of(season).fence(manifest.copy, bucket_group(bucket=bucket, groups=manifest.groups))


def test_a_group_written_between_the_round_trips_makes_the_read_retry(
        on_cluster: tuple[Season, redis.RedisCluster], monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first round trip, the player's bucket group is stamped with a later
    generation (what a mutation of the copy does first), then set back once the read has
    seen it: the read sees a torn version and retries, pinned to the version or not."""
    season, client = on_cluster
    manifest, entry, fence = _bucket_fence(season, "c03")
    before = client.hget(fence, "gen")
    sent = rank_reads.round_trip
    trips: list[list[tuple[Any, ...]]] = []

    def stamped(r: redis.Redis, commands: list[tuple[Any, ...]]) -> list[Any]:
        replies = sent(r, commands)
        trips.append(commands)
        if len(trips) == 1:
            client.hset(fence, "gen", manifest.gen + 1)
        elif len(trips) == 2:
            if before is None:
                client.hdel(fence, "gen")
            else:
                client.hset(fence, "gen", before)
        return replies

    monkeypatch.setattr(rank_reads, "round_trip", stamped)
    view = reader_of(season).rank("c03")
    assert view.entry == entry
    # Torn once, then read again in one round trip: the first attempt's lookup told the
    # player's place, read beside the lookup (checked by the same fence).
    assert len(trips) == 3, trips
    assert ("HGET", fence, "gen") in trips[1] and ("HGET", fence, "gen") in trips[2]

    trips.clear()
    view = reader_of(season).rank("c03", version=manifest.version)
    assert view.entry == entry
    assert len(trips) == 4, trips


# transaction: the fast path's 503 asks the database, from a thread, whether the season exists
@pytest.mark.django_db(transaction=True)
def test_a_pinned_current_version_that_stays_torn_is_unavailable_not_expired(
        on_cluster: tuple[Season, redis.RedisCluster]) -> None:
    """A slot group of the current copy names another generation than the version's (a
    failover left it behind) and keeps it: a read pinned to that version, which is still
    the current one, retries and then answers 503, not 410 (the version did not expire:
    the client can ask for it again once the next epoch repairs the copy)."""
    season, client = on_cluster
    manifest, entry, fence = _bucket_fence(season, "c03")
    client.hset(fence, "gen", manifest.gen - 1)
    reader = reader_of(season)
    pinned = manifest.version
    for read in (lambda: reader.rank("c03", pinned), lambda: reader.neighbors("c03", 2, pinned),
                 lambda: reader.window(1, len(PLAYERS), pinned), lambda: reader.players(["c03"], pinned)):
        with pytest.raises(rankview.Unavailable):
            read()
    for url in (f"/v1/seasons/{season.slug}/players/c03/rank?version={pinned}",
                f"/v1/seasons/{season.slug}/players/c03/rank"):
        answer = fast_get(url)
        assert answer.status_code == 503, (url, answer.status_code, answer.text)


def test_the_live_boards_reads_wait_for_a_connection_of_a_busy_node(
        on_cluster: tuple[Season, redis.RedisCluster]) -> None:
    """Rounds read at once through a cluster client of one connection per node: each waits
    for the node's connection (as the plain client's blocking pool makes them) instead of
    failing, and all answer as the ledger."""
    from django.conf import settings

    season, _ = on_cluster
    manifest = current_manifest(season)
    standings = db_standings(season)

    async def rounds() -> list[tuple[dict[str, PlayerRead], int]]:
        aclient = cast(redis.asyncio.Redis, redis.asyncio.RedisCluster.from_url(settings.REDIS_URL, max_connections=1))
        try:
            return await asyncio.gather(*(players_read_async(aclient, keys_of(season), manifest, {p: 1})
                                          for p in PLAYERS[:12]))
        finally:
            await aclient.aclose()

    for player_id, (reads, _) in zip(PLAYERS[:12], asyncio.run(rounds()), strict=True):
        assert reads[player_id].entry == standings.entry(player_id)
