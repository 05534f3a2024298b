"""The live board socket (docs/api.md, Live board websocket) through the real ASGI application (origin check,
URL routing, LiveBoardConsumer) with the channels-redis layer on a real Redis, epochs
publishing real versions: snapshots, pushed versions with diffs and player events, gap
recovery, refusals and their close codes, the FINAL state, per-process batching of the
player reads, and the slow-client policy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from channels.testing.websocket import WebsocketCommunicator
from django.conf import settings

from config.asgi import application
from leaderboard.core.live import Subscription, top_apply
from leaderboard.core.ranking import Standings
from leaderboard.live import announce
from leaderboard.live import hub as live
from leaderboard.live.announce import live_version_published, season_group
from leaderboard.live.players import PlayerRead, players_read, players_read_async
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import (
    NARROW,
    Events,
    announcements_muted,
    current_manifest,
    db_standings,
    keys_of,
    live_run,
    post_ok,
    publish,
)
from tests.support.reference import answer_entry

# Epochs read the change stream below the oldest running transaction (PostgreSQL): every
# test commits for real.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
ORIGIN = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
TIMEOUT = 10


run = live_run


async def connect(slug: str, query: str = "", headers: list[tuple[bytes, bytes]] | None = None
                  ) -> WebsocketCommunicator:
    path = f"/ws/v1/seasons/{slug}/live" + (f"?{query}" if query else "")
    comm = WebsocketCommunicator(application, path, headers=ORIGIN if headers is None else headers)
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    return comm


async def receive(comm: WebsocketCommunicator) -> dict[str, Any]:
    message: dict[str, Any] = await comm.receive_json_from(timeout=TIMEOUT)
    return message


apublish = sync_to_async(publish)


def expected_top(standings: Standings) -> list[dict[str, object]]:
    return [answer_entry(e) for e in standings.top(100)]


def expected_player(standings: Standings, player_id: str, radius: int) -> tuple[dict[str, Any] | None, list[Any]]:
    me = standings.entry(player_id)
    return (None if me is None else answer_entry(me)), [answer_entry(e) for e in standings.neighbors(player_id, radius)]


def board(season: Season, post_scores: Post, ev: Events, scores: dict[str, int]) -> None:
    post_ok(post_scores, season, [ev.result(p, s) for p, s in scores.items()])


# --- snapshots and pushed versions -----------------------------------------------------------


def test_snapshot_on_connect_then_one_message_per_published_version(season: Season, post_scores: Post) -> None:
    ev = Events()
    board(season, post_scores, ev, {f"p{i:03d}": 1000 + 10 * i for i in range(150)})
    assert publish(season) == 1
    v1 = db_standings(season)
    apost = sync_to_async(post_ok)

    async def body() -> None:
        watcher = await connect(season.slug)
        player = await connect(season.slug, "player_id=p020&radius=3")
        snap = await receive(watcher)
        assert snap["type"] == "snapshot"
        assert (snap["season_id"], snap["state"], snap["leaderboard_version"]) == (season.slug, season.state, 1)
        assert snap["as_of"] == (await sync_to_async(current_manifest)(season)).as_of
        assert snap["total_players"] == 150
        assert snap["top"] == expected_top(v1)
        assert "player" not in snap

        psnap = await receive(player)
        entry, around = expected_player(v1, "p020", 3)
        assert psnap["leaderboard_version"] == 1
        assert psnap["top"] == snap["top"]
        # 150 players, p020 at rank 130 alone: 20 below it.
        assert psnap["player"] == {"player_id": "p020", "ranked": True, "entry": entry, "radius": 3,
                                   "neighbors": around, "percentile": 13.33, "rank_24h_ago": None}
        assert entry is not None and entry["rank"] == 130

        # p020 jumps into the top 100 and a newcomer takes first place.
        await apost(post_scores, season, [ev.result("p020", 2500), ev.result("zed", 5000)])
        assert await apublish(season) == 2
        v2 = await sync_to_async(db_standings)(season)
        manifest = await sync_to_async(current_manifest)(season)

        pushed = await receive(watcher)
        assert pushed["type"] == "version"
        assert (pushed["leaderboard_version"], pushed["previous_version"]) == (2, 1)
        assert pushed["as_of"] == manifest.as_of and pushed["total_players"] == 151
        assert "top" not in pushed and pushed["top_diff"]["base_version"] == 1
        assert top_apply(snap["top"], pushed["top_diff"]) == expected_top(v2)
        assert "player" not in pushed

        ppushed = await receive(player)
        assert ppushed["top_diff"] == pushed["top_diff"]
        entry, around = expected_player(v2, "p020", 3)
        assert ppushed["player"]["entry"] == entry and ppushed["player"]["neighbors"] == around
        assert entry is not None and entry["rank"] == 2
        assert ppushed["player"]["events"] == [
            {"type": "score_changed", "from": 1200, "to": 2500},
            {"type": "rank_changed", "from": 130, "to": 2},
            {"type": "entered_top_100", "position": 2, "rank": 2},
        ]

        # A version that changes nothing in the top or for the player: an empty diff, no events.
        await apost(post_scores, season, [ev.result("p000", 1001)])
        assert await apublish(season) == 3
        quiet = await receive(player)
        assert quiet["leaderboard_version"] == 3 and quiet["previous_version"] == 2
        assert quiet["top_diff"] == {"base_version": 2, "length": 100, "set": []}
        assert quiet["player"]["events"] == []
        assert (await receive(watcher))["top_diff"] == quiet["top_diff"]

        for comm in (watcher, player):
            assert await comm.receive_nothing(timeout=0.2)
            await comm.disconnect()

    run(body)


def test_unavailable_before_the_first_version_then_the_full_board(season: Season, post_scores: Post) -> None:
    ev = Events()
    board(season, post_scores, ev, {"a": 10, "b": 20})

    async def body() -> None:
        comm = await connect(season.slug, "player_id=a")
        first = await receive(comm)
        assert first["type"] == "unavailable"
        assert first["season_id"] == season.slug and first["retry_after"] >= 1
        assert await apublish(season) == 1
        pushed = await receive(comm)
        # Nothing to diff against on this socket: the full top, and no events (no baseline).
        assert pushed["type"] == "version" and pushed["previous_version"] is None
        assert "top_diff" not in pushed
        assert [e["player_id"] for e in pushed["top"]] == ["b", "a"]
        assert pushed["player"]["entry"] == answer_entry({"position": 2, "rank": 2, "player_id": "a", "score": 10})
        assert pushed["player"]["events"] == []
        await comm.disconnect()

    run(body)


def test_views_lost_answers_unavailable(season: Season, post_scores: Post, rank_views: Any) -> None:
    board(season, post_scores, Events(), {"a": 10})
    publish(season)
    rank_views.flushdb()  # the views are gone; the ledger is not
    rankview.manifest_cache_clear()

    async def body() -> None:
        comm = await connect(season.slug)
        assert (await receive(comm))["type"] == "unavailable"
        await comm.disconnect()

    run(body)


def test_player_not_on_the_board_then_ranked(season: Season, post_scores: Post) -> None:
    ev = Events()
    board(season, post_scores, ev, {f"p{i}": 100 + i for i in range(5)})
    publish(season)

    async def body() -> None:
        comm = await connect(season.slug, "player_id=later")
        snap = await receive(comm)
        assert snap["player"] == {"player_id": "later", "ranked": False, "entry": None, "radius": 5,
                                  "neighbors": [], "percentile": None, "rank_24h_ago": None}
        await sync_to_async(post_ok)(post_scores, season, [ev.result("later", 50)])
        await apublish(season)
        pushed = await receive(comm)
        assert pushed["player"]["entry"] == answer_entry({"position": 6, "rank": 6, "player_id": "later", "score": 50})
        assert [e["player_id"] for e in pushed["player"]["neighbors"]] == ["p4", "p3", "p2", "p1", "p0", "later"]
        assert pushed["player"]["events"] == [
            {"type": "ranked", "rank": 6, "position": 6, "score": 50},
            {"type": "entered_top_100", "position": 6, "rank": 6},
        ]
        await comm.disconnect()

    run(body)


# --- gaps ------------------------------------------------------------------------------------


def test_a_missed_version_gets_the_full_top_and_a_snapshot_on_request(
        season: Season, post_scores: Post, monkeypatch: pytest.MonkeyPatch) -> None:
    ev = Events()
    board(season, post_scores, ev, {f"p{i:02d}": 100 + i for i in range(30)})
    publish(season)
    apost = sync_to_async(post_ok)

    async def body() -> None:
        comm = await connect(season.slug, "player_id=p00")
        assert (await receive(comm))["leaderboard_version"] == 1
        # Version 2 is published but its announcement is lost.
        with announcements_muted():
            await apost(post_scores, season, [ev.result("p00", 500)])
            assert await apublish(season) == 2
        assert await comm.receive_nothing(timeout=0.3)
        await apost(post_scores, season, [ev.result("p01", 600)])
        assert await apublish(season) == 3
        v3 = await sync_to_async(db_standings)(season)

        pushed = await receive(comm)
        # The server knows it last sent version 1: no diff against 2, events since 1.
        assert (pushed["leaderboard_version"], pushed["previous_version"]) == (3, 1)
        assert "top_diff" not in pushed and pushed["top"] == expected_top(v3)
        # (p00 was in the top 100 of 30 players already: no entered_top_100.)
        assert pushed["player"]["events"] == [
            {"type": "score_changed", "from": 100, "to": 500},
            {"type": "rank_changed", "from": 30, "to": 2},
        ]

        # A client that lost track anyway asks for a snapshot: the current version, whole.
        await comm.send_json_to({"type": "snapshot"})
        snap = await receive(comm)
        assert snap["type"] == "snapshot" and snap["leaderboard_version"] == 3
        assert snap["top"] == expected_top(v3)
        entry, around = expected_player(v3, "p00", 5)
        assert snap["player"]["entry"] == entry and snap["player"]["neighbors"] == around
        await comm.disconnect()

    run(body)


def test_snapshot_requests_are_rate_limited(season: Season, post_scores: Post) -> None:
    board(season, post_scores, Events(), {"a": 1})
    publish(season)

    async def body() -> None:
        comm = await connect(season.slug)
        await receive(comm)
        for _ in range(5):
            await comm.send_json_to({"type": "snapshot"})
            assert (await receive(comm))["type"] == "snapshot"
        await comm.send_json_to({"type": "snapshot"})
        refused = await receive(comm)
        assert refused["error"] == "too_many_snapshots"
        assert (await comm.receive_output(timeout=TIMEOUT)) == {"type": "websocket.close", "code": 4429,
                                                               "reason": "too_many_snapshots"}
        await comm.disconnect()

    run(body)


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(("slug", "query", "code", "error"), [
    ("no-such-season", "", 4404, "unknown_season"),
    ("s1", "player_id=bad%20id", 4400, "bad_player_id"),
    ("s1", "player_id=" + "x" * 65, 4400, "bad_player_id"),
    ("s1", "player_id=ok&radius=50", 4400, "bad_radius"),
])
def test_bad_ids_close_with_a_reason(season: Season, slug: str, query: str, code: int, error: str) -> None:
    async def body() -> None:
        comm = await connect(slug, query)
        message = await receive(comm)
        assert message["type"] == "error" and message["error"] == error and message["detail"]
        close = await comm.receive_output(timeout=TIMEOUT)
        assert close["type"] == "websocket.close" and close["code"] == code
        await comm.disconnect()

    run(body)


@pytest.mark.parametrize("frame", [{"text_data": '{"type": "apply_score", "score": 1}'}, {"text_data": "hello"},
                                   {"bytes_data": b"\x01\x02"}])
def test_the_socket_accepts_no_writes(season: Season, post_scores: Post, frame: dict[str, Any]) -> None:
    board(season, post_scores, Events(), {"a": 1})
    publish(season)

    async def body() -> None:
        comm = await connect(season.slug)
        await receive(comm)
        await comm.send_to(**frame)
        refused = await receive(comm)
        assert refused["type"] == "error" and refused["error"] == "unsupported_message"
        close = await comm.receive_output(timeout=TIMEOUT)
        assert close["code"] == 4400
        await comm.disconnect()

    run(body)


def test_a_foreign_origin_is_refused_and_the_refusal_holds_nothing(season: Season) -> None:
    async def body() -> None:
        foreign = WebsocketCommunicator(application, f"/ws/v1/seasons/{season.slug}/live",
                                        headers=[(b"origin", b"https://evil.example")])
        no_origin = WebsocketCommunicator(application, f"/ws/v1/seasons/{season.slug}/live")
        for comm in (foreign, no_origin):
            connected, _ = await comm.connect(timeout=TIMEOUT)
            assert not connected
            # The application is done once the handshake is refused: no consumer waits
            # for the client to go, with a channel-layer receive polling Redis meanwhile.
            await asyncio.wait_for(asyncio.shield(comm.future), 2)
        assert live.registry().hubs == {}

    run(body)


# --- season state ----------------------------------------------------------------------------


def test_final_season_state_is_in_the_snapshot(season: Season, post_scores: Post) -> None:
    board(season, post_scores, Events(), {"a": 3, "b": 2})
    publish(season)
    Season.objects.filter(pk=season.pk).update(state="FINAL", final_version=1)

    async def body() -> None:
        comm = await connect(season.slug)
        snap = await receive(comm)
        assert (snap["state"], snap["final_version"], snap["leaderboard_version"]) == ("FINAL", 1, 1)
        assert [e["player_id"] for e in snap["top"]] == ["a", "b"]
        # An announcement of a version the socket already holds sends nothing.
        await sync_to_async(live_version_published)(season.slug, 1)
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()

    run(body)


def test_the_announcement_carries_the_state(season: Season, post_scores: Post) -> None:
    ev = Events()
    board(season, post_scores, ev, {"a": 3})
    publish(season)

    async def body() -> None:
        comm = await connect(season.slug)
        assert (await receive(comm))["state"] == season.state
        await sync_to_async(post_ok)(post_scores, season, [ev.result("b", 9)])
        await sync_to_async(Season.objects.filter(pk=season.pk).update)(state="FINALIZING")
        assert await apublish(season) == 2
        pushed = await receive(comm)
        assert (pushed["leaderboard_version"], pushed["state"]) == (2, "FINALIZING")
        await comm.disconnect()

    run(body)


def test_a_failing_channel_layer_never_fails_the_epoch_and_is_left_alone_for_a_while(
        season: Season, post_scores: Post, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []

    class Broken:
        async def group_send(self, group: str, message: dict[str, Any]) -> None:
            sent.append(message["version"])
            raise ConnectionError("redis down")

    monkeypatch.setattr(announce, "get_channel_layer", lambda: Broken())
    monkeypatch.setattr(announce, "_quiet_until", 0.0)  # and put back after the test
    ev = Events()
    board(season, post_scores, ev, {"a": 3})
    assert publish(season) == 1
    # The next epochs do not try (each would wait out a hung layer's timeout) ...
    board(season, post_scores, ev, {"a": 4})
    assert publish(season) == 2
    assert sent == [1]
    # ... until the quiet period is over.
    monkeypatch.setattr(announce, "_quiet_until", 0.0)
    board(season, post_scores, ev, {"a": 5})
    assert publish(season) == 3
    assert sent == [1, 3]


# --- batching --------------------------------------------------------------------------------


def test_player_reads_are_one_batch_per_version_per_process(season_factory: Callable[..., Season],
                                                            post_scores: Post) -> None:
    season = season_factory(slug="batch")
    ev = Events()
    board(season, post_scores, ev, {f"p{i:03d}": (i * 37) % 500 for i in range(300)})
    publish(season)
    players = ["p000", "p007", "p150", "p299", "ghost", "p007"]  # p007 twice, one not ranked

    async def body() -> None:
        comms = [await connect(season.slug, f"player_id={p}&radius={r}") for p, r in zip(players, [0, 2, 10, 5, 5, 9],
                                                                                           strict=True)]
        comms.append(await connect(season.slug))
        for comm in comms:
            assert (await receive(comm))["type"] == "snapshot"
        hub = live.registry().hubs[season.slug]
        assert hub.wanted() == {"p000": 0, "p007": 9, "p150": 10, "p299": 5, "ghost": 5}
        await sync_to_async(post_ok)(post_scores, season, [ev.result("p150", 499), ev.result("p299", 1)])
        assert await apublish(season) == 2
        v2 = await sync_to_async(db_standings)(season)
        messages = [await receive(comm) for comm in comms]
        # One round for the version in this process: five players, four Redis round trips.
        assert (hub.stats.rounds, hub.stats.players_read, hub.stats.round_trips) == (1, 5, 4)
        for (player_id, radius), message in zip(zip(players, [0, 2, 10, 5, 5, 9], strict=True), messages,
                                                strict=False):
            entry, around = expected_player(v2, player_id, radius)
            assert message["player"]["entry"] == entry, player_id
            assert message["player"]["neighbors"] == around, (player_id, radius)
        assert "player" not in messages[-1]
        for comm in comms:
            await comm.disconnect()
        assert season.slug not in live.registry().hubs

    run(body)


def test_announcements_during_a_round_are_coalesced_into_one_round_of_the_newest(
        season: Season, post_scores: Post, monkeypatch: pytest.MonkeyPatch) -> None:
    ev = Events()
    board(season, post_scores, ev, {f"p{i:02d}": 100 + i for i in range(30)})
    publish(season)

    async def body() -> None:
        comms = [await connect(season.slug, q) for q in ("", "", "player_id=p00&radius=1")]
        for comm in comms:
            assert (await receive(comm))["leaderboard_version"] == 1
        hub = live.registry().hubs[season.slug]
        with announcements_muted():
            for player_id, score in (("p00", 500), ("p01", 600)):
                await sync_to_async(post_ok)(post_scores, season, [ev.result(player_id, score)])
                await apublish(season)
        v3 = await sync_to_async(db_standings)(season)
        # Both announcements arrive before the process could send the first.
        hub.announce({"version": 2, "state": season.state, "final_version": None})
        hub.announce({"version": 3, "state": season.state, "final_version": None})
        messages = [await receive(comm) for comm in comms]
        for message in messages:
            assert (message["leaderboard_version"], message["previous_version"]) == (3, 1)
            assert "top_diff" not in message and message["top"] == expected_top(v3)
        assert messages[0] == messages[1]
        entry, around = expected_player(v3, "p00", 1)
        assert messages[2]["player"]["entry"] == entry and messages[2]["player"]["neighbors"] == around
        assert messages[2]["player"]["events"] == [{"type": "score_changed", "from": 100, "to": 500},
                                                   {"type": "rank_changed", "from": 30, "to": 2}]
        # One round, and no send had to wait for its client (none needed a task).
        assert (hub.stats.rounds, hub.stats.slow, hub.stats.skipped_busy) == (1, 0, 0)
        for comm in comms:
            assert await comm.receive_nothing(timeout=0.2)
            await comm.disconnect()

    run(body)


def test_players_read_matches_the_reference_with_ties_and_bucket_edges(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    from leaderboard.redis_client import redis_get

    season = season_factory(slug="reads", layout=NARROW)
    ev = Events()
    # Scores on bucket edges and many ties, so windows span buckets and start inside ties.
    scores = {f"u{i:03d}": [0, 99, 100, 100, 199, 200, 500, 500, 500, 999][i % 10] + (i // 40) for i in range(120)}
    board(season, post_scores, ev, scores)
    publish(season)
    reference = db_standings(season)
    manifest = current_manifest(season)
    wanted = {p: (i % 11) for i, p in enumerate(sorted(scores))} | {"absent": 3}
    reads, trips = players_read(redis_get(), keys_of(season), manifest, wanted)
    assert trips == 4
    for player_id, radius in wanted.items():
        read = reads[player_id]
        assert read.radius == radius
        assert read.entry == reference.entry(player_id), player_id
        assert list(read.window) == reference.neighbors(player_id, radius), (player_id, radius)

    async def through_asyncio() -> None:
        # The live boards' own client: per node on a cluster.
        client = live.LiveRegistry().redis()
        try:
            assert await players_read_async(client, keys_of(season), manifest, wanted) == (reads, 4)
            assert await players_read_async(client, keys_of(season), manifest, {"absent": 2}) == (
                {"absent": PlayerRead(entry=None, radius=2)}, 2)
        finally:
            await client.aclose()

    run(through_asyncio)


def test_a_superseded_version_is_not_read_for_players(season: Season, post_scores: Post, rank_views: Any) -> None:
    from leaderboard.redis_client import redis_get

    ev = Events()
    board(season, post_scores, ev, {"a": 1, "b": 2})
    publish(season)
    manifest = current_manifest(season)
    # The copy that held the version moves on (two more versions: it is mutated again).
    for score in (3, 4):
        post_ok(post_scores, season, [ev.result("a", score)])
        publish(season)
    with pytest.raises(rankview.Torn):
        players_read(redis_get(), keys_of(season), manifest, {"a": 1})


# --- the process's group listener ---------------------------------------------------------


def layer_redis() -> redis.Redis:
    """The channel layer's Redis (the rank views' on a single Redis; a plain one beside a cluster)."""
    return redis.Redis.from_url(settings.CHANNEL_LAYER_URLS[0])


def group_members(r: Any, slug: str) -> list[bytes]:
    """Members of the season's group in channels-redis (its sorted set `...group:{name}`)."""
    keys = list(r.scan_iter(match=f"*group:{season_group(slug)}"))
    assert len(keys) <= 1
    return list(r.zrange(keys[0], 0, -1)) if keys else []


def test_the_process_not_each_socket_is_in_the_group(season: Season, post_scores: Post, rank_views: Any) -> None:
    ev = Events()
    board(season, post_scores, ev, {"a": 1})
    publish(season)

    # The channel layer's Redis is flushed with the rank views' only when they are one server:
    # beside a cluster, earlier tests' processes may still be in the group.
    layer = layer_redis()
    for key in layer.scan_iter(match=f"*group:{season_group(season.slug)}"):
        layer.delete(key)

    async def body() -> None:
        comms = [await connect(season.slug, q) for q in ("", "player_id=a", "player_id=b", "")]
        for comm in comms:
            await receive(comm)
        members = await sync_to_async(group_members)(layer_redis(), season.slug)
        assert len(members) == 1 and members[0].startswith(b"live.")
        hub = live.registry().hubs[season.slug]
        await sync_to_async(post_ok)(post_scores, season, [ev.result("b", 5)])
        await apublish(season)
        for comm in comms:
            assert (await receive(comm))["leaderboard_version"] == 2
        assert hub.stats.announcements == 1
        for comm in comms:
            await comm.disconnect()
        assert season.slug not in live.registry().hubs
        assert hub.listener is not None
        with contextlib.suppress(asyncio.CancelledError):
            await hub.listener
        assert await sync_to_async(group_members)(layer_redis(), season.slug) == []

    run(body)


async def assert_stopped(hub: live.SeasonHub) -> None:
    """The process holds no hub any more, and `hub`'s tasks ended after leaving its group."""
    assert live.registry().hubs == {}
    assert hub.tasks() and all(task.done() for task in hub.tasks())
    assert await sync_to_async(group_members)(layer_redis(), hub.slug) == []


def test_closing_the_registry_stops_every_hub_and_leaves_the_groups(season: Season, post_scores: Post,
                                                                    rank_views: Any) -> None:
    board(season, post_scores, Events(), {"a": 1})
    publish(season)

    async def body() -> None:
        comms = [await connect(season.slug), await connect(season.slug, "player_id=a")]
        for comm in comms:
            await receive(comm)
        hub = live.registry().hubs[season.slug]
        assert len(await sync_to_async(group_members)(layer_redis(), season.slug)) == 1
        await asyncio.wait_for(live.registry().aclose(), TIMEOUT)
        assert all(socket.closed for socket in hub.sockets.values())
        await assert_stopped(hub)
        for comm in comms:
            await comm.disconnect()

    run(body)


def test_the_servers_shutdown_waits_for_the_hubs_to_leave_their_groups(season: Season, post_scores: Post,
                                                                       rank_views: Any) -> None:
    board(season, post_scores, Events(), {"a": 1})
    publish(season)

    async def body() -> None:
        lifespan = ApplicationCommunicator(application, {"type": "lifespan", "asgi": {"version": "3.0"}})
        try:
            await lifespan.send_input({"type": "lifespan.startup"})
            assert await lifespan.receive_output(TIMEOUT) == {"type": "lifespan.startup.complete"}
            comm = await connect(season.slug)
            await receive(comm)
            hub = live.registry().hubs[season.slug]
            assert len(await sync_to_async(group_members)(layer_redis(), season.slug)) == 1
            # The server's order: it closes the sockets, then sends the shutdown at once.
            await comm.disconnect()
            await lifespan.send_input({"type": "lifespan.shutdown"})
            assert await lifespan.receive_output(TIMEOUT) == {"type": "lifespan.shutdown.complete"}
            await assert_stopped(hub)
            await lifespan.wait(TIMEOUT)
        finally:
            lifespan.stop(exceptions=False)  # an assertion failed before the shutdown ended it

    run(body)


def test_a_lost_group_is_joined_again(season: Season, post_scores: Post, rank_views: Any, settings: Any) -> None:
    settings.LIVE_GROUP_REFRESH_SECONDS = 0.2
    ev = Events()
    board(season, post_scores, ev, {"a": 1})
    publish(season)

    async def body() -> None:
        comm = await connect(season.slug)
        await receive(comm)
        # Redis forgets the group (an expiry, a failover that lost data): the listener joins again.
        layer = layer_redis()
        for key in await sync_to_async(lambda: list(layer.scan_iter(match="*group:live.*")))():
            await sync_to_async(layer.delete)(key)
        await asyncio.sleep(0.5)
        assert len(await sync_to_async(group_members)(layer, season.slug)) == 1
        await sync_to_async(post_ok)(post_scores, season, [ev.result("b", 5)])
        await apublish(season)
        assert (await receive(comm))["leaderboard_version"] == 2
        await comm.disconnect()

    run(body)


def test_no_group_no_socket(season: Season, post_scores: Post, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the group cannot be joined (Redis down), the socket says so and closes (1013,
    try again later) instead of waiting for versions that would never come."""
    class Down:
        async def new_channel(self, prefix: str = "specific") -> str:
            return f"{prefix}.x!y"

        async def group_add(self, group: str, channel: str) -> None:
            raise ConnectionError("redis down")

        async def group_discard(self, group: str, channel: str) -> None:
            raise ConnectionError("redis down")

    monkeypatch.setattr(live, "get_channel_layer", lambda: Down())
    monkeypatch.setattr(live, "JOIN_TIMEOUT_SECONDS", 0.3)

    async def body() -> None:
        comm = await connect(season.slug)
        assert (await receive(comm))["type"] == "unavailable"
        close = await comm.receive_output(timeout=TIMEOUT)
        assert (close["type"], close["code"]) == ("websocket.close", 1013)
        await comm.disconnect()
        assert season.slug not in live.registry().hubs or not live.registry().hubs[season.slug].sockets

    run(body)


# --- slow clients ----------------------------------------------------------------------------


def stalling(after: int) -> Any:
    """The application, with a client that stops reading after `after` frames: every later
    send waits forever, as a full TCP buffer would."""
    async def app(scope: Any, receive_: Any, send: Any) -> None:
        sent = 0

        async def stuck_send(message: dict[str, Any]) -> None:
            nonlocal sent
            if message["type"] == "websocket.send":
                sent += 1
                if sent > after:
                    await asyncio.Event().wait()
            await send(message)

        await application(scope, receive_, stuck_send)

    return app


def test_a_slow_client_is_dropped_without_delaying_the_others(season: Season, post_scores: Post,
                                                               settings: Any) -> None:
    settings.LIVE_SEND_TIMEOUT_SECONDS = 1.0
    ev = Events()
    board(season, post_scores, ev, {"a": 1, "b": 2})
    publish(season)

    async def body() -> None:
        slow = WebsocketCommunicator(stalling(after=1), f"/ws/v1/seasons/{season.slug}/live?player_id=a",
                                     headers=ORIGIN)
        assert (await slow.connect(timeout=TIMEOUT))[0]
        assert (await receive(slow))["type"] == "snapshot"
        fast = await connect(season.slug, "player_id=b")
        assert (await receive(fast))["type"] == "snapshot"
        hub = live.registry().hubs[season.slug]
        assert len(hub.sockets) == 2

        await sync_to_async(post_ok)(post_scores, season, [ev.result("a", 5)])
        loop = asyncio.get_running_loop()
        await apublish(season)
        started = loop.time()
        pushed = await receive(fast)
        assert pushed["leaderboard_version"] == 2
        assert loop.time() - started < 0.8  # not held up by the stuck one (1 s send timeout)
        close = await slow.receive_output(timeout=TIMEOUT)
        assert close == {"type": "websocket.close", "code": 4408, "reason": "slow_consumer"}
        await slow.wait(timeout=TIMEOUT)
        assert [socket.subscription for socket in hub.sockets.values()] == [Subscription(player_id="b", radius=5)]
        await fast.disconnect()

    run(body)


# --- an idle socket ----------------------------------------------------------------------------


def test_a_socket_idle_longer_than_the_layer_poll_still_gets_the_next_version(season: Season,
                                                                             post_scores: Post) -> None:
    """channels-redis waits for messages with BZPOPMIN for `brpop_timeout` (5 s) per call. A
    Redis client whose read timeout is not longer (redis-py 8 defaults to 5 s) times out
    every idle poll: the listener must survive that (and warn about the configuration)."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    ev = Events()
    board(season, post_scores, ev, {"a": 1})
    publish(season)

    async def body() -> None:
        comm = await connect(season.slug)
        assert (await receive(comm))["leaderboard_version"] == 1
        await asyncio.sleep(layer.brpop_timeout + 1.5)
        await sync_to_async(post_ok)(post_scores, season, [ev.result("b", 2)])
        assert await apublish(season) == 2
        pushed = await receive(comm)
        assert pushed["leaderboard_version"] == 2
        await comm.disconnect()

    run(body)
