"""Live boards over websockets (docs/architecture.md, Live boards): publication, per-process fan-out, batched reads.

One published version reaches the sockets like this:

1. The epoch swaps the pointer to version V, records it, and (on commit) calls
   `live_version_published`: ONE `channel_layer.group_send` to the season's group
   `live.{season}` carrying only {version, state}.
2. The members of that group are server processes, not sockets: each process that has
   sockets of the season runs one listener (`_listen`) with one channel in the group, so
   the announcement is one small Redis message per process. The listener hands it to the
   in-memory inbox of each of the process's sockets of the season (`SeasonHub.announce`).
3. The first socket that takes V from its inbox starts the process's *round* for V
   (`SeasonHub.round`), read with the process's asyncio Redis client in the event loop (a
   worker thread would fight the loop for the GIL while it sends): the manifests of V and
   V-1 (cached per process), the part of the message every socket shares serialized twice
   (full top 100, and the diff against V-1); then rank and neighbours of every player
   subscribed in this process in at most four pipelined round trips (`players_plan`),
   whatever their number. Every other socket of the process awaits the same round, the
   sockets without a player only its first half; a player nobody in the process watches
   is never read.
4. Each socket splices its own few fields (its `previous_version`, its player's entry,
   neighbours and events) onto the shared text and sends it, bounded by a send timeout:
   a slow client is dropped (close 4408) instead of holding anything others wait for.

Per process means per event loop: a uvicorn worker has one; tests create one per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
import redis.asyncio
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from leaderboard import rankview
from leaderboard.core.epoch import locate_position
from leaderboard.core.live import TOP_LIMIT, Subscription, player_payload, top_diff
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry, ranked_values
from leaderboard.core.tiebreak import IndexValue, index_key, index_value, lookup_value, value_score
from leaderboard.selectors import leaderboard_reader, read_unavailable
from seasons.models import Season

log = logging.getLogger(__name__)

GROUP_PREFIX = "live"
# Rounds a process keeps per season: a socket that is a few versions behind still finds
# its version's round; anything older is superseded anyway (sockets skip it).
ROUNDS_KEPT = 4
# The type of the group message, routed by Channels to LiveBoardConsumer.live_version.
VERSION_EVENT = "live.version"
# Announcements a socket may have waiting; past that the oldest goes (a newer version
# supersedes it). A socket's own dispatch loop drains its inbox.
INBOX_SIZE = 8
JOIN_TIMEOUT_SECONDS = 10.0
ASYNC_REDIS_CONNECTIONS = 16


def send_timeout() -> float:
    """How long one send to one socket may wait for the client to drain its buffer."""
    return settings.LIVE_SEND_TIMEOUT_SECONDS


def group_refresh_seconds() -> float:
    """How often a process re-joins a season's group: channels-redis forgets members after
    `group_expiry`, and a Redis that lost its data has forgotten them already."""
    return settings.LIVE_GROUP_REFRESH_SECONDS


def season_group(season_slug: str) -> str:
    # Slugs are [-a-zA-Z0-9_] and at most 64 characters: always a valid group name.
    return f"{GROUP_PREFIX}.{season_slug}"


# --------------------------------------------------------------------------- publication


def season_live_state(season_slug: str) -> tuple[str, int | None] | None:
    """(state, final_version) of a season, or None when there is no such season."""
    row = Season.objects.filter(slug=season_slug).values_list("state", "final_version").first()
    return None if row is None else (row[0], row[1])


def live_version_published(season_slug: str, version: int) -> None:
    """Tell every live socket of the season that `version` is published: one group_send.

    Called by the epoch after the pointer swap (through transaction.on_commit). It must
    never fail the epoch: the version is published whether or not anyone is told, and a
    socket that misses it catches up with the next one (full top, events since what it
    last sent).
    """
    try:
        layer = get_channel_layer()
        if layer is None:
            return
        found = season_live_state(season_slug)
        state, final_version = found if found is not None else (None, None)
        async_to_sync(layer.group_send)(season_group(season_slug), {
            "type": VERSION_EVENT, "season": season_slug, "version": version,
            "state": state, "final_version": final_version,
        })
    except Exception:
        log.exception("live: could not announce version %s of season %s", version, season_slug)


# ------------------------------------------------------------------------- batched reads


@dataclass(frozen=True, slots=True)
class PlayerRead:
    """A player in one version: its entry (None: not ranked) and the entries around it
    within the widest radius any socket of the process asked for."""

    entry: Entry | None
    window: tuple[Entry, ...] = ()
    radius: int = 0


# A Redis command for a pipeline: method name, positional and keyword arguments. The same
# names and signatures exist on redis-py's sync and asyncio pipelines.
Call = tuple[str, tuple[Any, ...], dict[str, Any]]
Plan = Generator[list[Call], list[Any], dict[str, "PlayerRead"]]


def players_read(r: redis.Redis, keys: rankview.Keys, manifest: Manifest,
                 wanted: Mapping[str, int]) -> tuple[dict[str, PlayerRead], int]:
    """`players_plan` on a sync client: (reads, round trips). Raises rankview.Torn."""
    plan = players_plan(keys, manifest, wanted)
    trips = 0
    try:
        calls = next(plan)
        while True:
            with r.pipeline(transaction=False) as pipe:
                for name, args, kwargs in calls:
                    getattr(pipe, name)(*args, **kwargs)
                replies = pipe.execute()
            trips += 1
            calls = plan.send(replies)
    except StopIteration as done:
        return done.value, trips


async def players_read_async(r: redis.asyncio.Redis, keys: rankview.Keys, manifest: Manifest,
                             wanted: Mapping[str, int]) -> tuple[dict[str, PlayerRead], int]:
    """`players_plan` on an asyncio client, in the event loop: no worker thread to contend
    for the GIL with the loop that is sending the same version to other sockets."""
    plan = players_plan(keys, manifest, wanted)
    trips = 0
    try:
        calls = next(plan)
        while True:
            async with r.pipeline(transaction=False) as pipe:
                for name, args, kwargs in calls:
                    getattr(pipe, name)(*args, **kwargs)
                replies = await pipe.execute()
            trips += 1
            calls = plan.send(replies)
    except StopIteration as done:
        return done.value, trips


def players_plan(keys: rankview.Keys, manifest: Manifest, wanted: Mapping[str, int]) -> Plan:
    """Rank and neighbours of many players in one version, in at most four pipelined round trips.

    A generator that yields the commands of each round trip and receives their replies (so
    the sync and the asyncio drivers share it). `wanted` maps player_id -> radius.
    Raises rankview.Torn when the manifest's copy no longer holds the version after the
    reads (it was superseded and its grace period passed): nothing read is then trusted.
    The last round trip re-reads the copy's generation and version after every data read
    (Redis runs one command at a time, and each round trip starts after the previous one
    answered), the same seqlock the single-player reads of RankReader use.
    """
    out = {player_id: PlayerRead(entry=None, radius=radius) for player_id, radius in wanted.items()}
    if not wanted:
        return out
    layout = manifest.layout
    copy = manifest.copy

    def bucket_key(bucket: int) -> str:
        return keys.bucket(copy, layout.layout_id, bucket)

    # 1. Scores from the copy's lookup: one HMGET per lookup shard.
    by_shard: dict[int, list[str]] = {}
    for player_id in wanted:
        by_shard.setdefault(rankview.lookup_shard(player_id), []).append(player_id)
    shards = list(by_shard.items())
    replies = yield [("hmget", (keys.lookup(copy, shard), players), {}) for shard, players in shards]
    # Values: scores, or (score, reached_ms) on a first_reached board (core.tiebreak).
    ties = manifest.ties
    found = [(player_id, lookup_value(ties, value)) for (_, players), values in zip(shards, replies, strict=True)
             for player_id, value in zip(players, values, strict=True) if value is not None]

    # 2. Players ranked ahead and the index of each found player in its bucket.
    located: dict[str, Entry] = {}
    value_of: dict[str, IndexValue] = {}
    if found:
        calls: list[Call] = []
        for player_id, value in found:
            bucket, sort_key = index_key(layout, ties, value)
            calls.append(("zcount", (bucket_key(bucket), "-inf", f"({sort_key}"), {}))
            calls.append(("zrank", (bucket_key(bucket), player_id), {}))
        replies = yield calls
        for i, (player_id, value) in enumerate(found):
            higher, index = replies[2 * i], replies[2 * i + 1]
            if index is None:
                raise rankview.Torn()  # the lookup and the index disagree: mid-mutation
            before = manifest.higher[layout.bucket_of(value_score(value))]
            value_of[player_id] = value
            located[player_id] = Entry(position=before + int(index) + 1, rank=before + int(higher) + 1,
                                       player_id=player_id, score=value_score(value))

    # 3. Each player's window of positions, as ranges of buckets; identical ranges (players
    #    near each other) are read once.
    windows: dict[str, tuple[int, int, list[tuple[int, int, int]]]] = {}
    ranges: dict[tuple[int, int, int], int] = {}
    for player_id, me in located.items():
        radius = wanted[player_id]
        first = max(1, me.position - radius)
        last = min(manifest.total, me.position + radius)
        spans = _bucket_ranges(manifest.counts, first, last - first + 1)
        windows[player_id] = (first, last, spans)
        for span in spans:
            ranges.setdefault(span, len(ranges))
    pairs_of: list[list[tuple[str, IndexValue]]] = []
    if ranges:
        replies = yield [("zrange", (bucket_key(bucket), start, stop), {"withscores": True})
                         for bucket, start, stop in ranges]
        pairs_of = [[(m.decode(), index_value(layout, ties, bucket, s)) for m, s in reply]
                    for (bucket, _, _), reply in zip(ranges, replies, strict=True)]

    # 4. The rank of each window's first entry when it is not known already (it is for
    #    position 1 and when it shares the player's score), then the seqlock check.
    pending: dict[str, tuple[int, list[tuple[str, IndexValue]]]] = {}
    rank_queries: dict[IndexValue, int] = {}
    for player_id, (first, last, spans) in windows.items():
        pairs = [pair for span in spans for pair in pairs_of[ranges[span]]]
        me = located[player_id]
        if len(pairs) != last - first + 1 or pairs[me.position - first] != (player_id, value_of[player_id]):
            raise rankview.Torn()  # a bucket holds other members than the manifest counted
        pending[player_id] = (first, pairs)
        first_score = pairs[0][1]
        if first != 1 and first_score != value_of[player_id]:
            rank_queries.setdefault(first_score, len(rank_queries))
    keyed = {value: index_key(layout, ties, value) for value in rank_queries}
    replies = yield [("zcount", (bucket_key(keyed[value][0]), "-inf", f"({keyed[value][1]}"), {})
                     for value in rank_queries] + [("hmget", (keys.copy_meta(copy), ["gen", "version"]), {})]
    gen, version = replies[-1]
    if gen is None or version is None or int(gen) != manifest.gen or int(version) != manifest.version:
        raise rankview.Torn()
    rank_of_score = {
        value: manifest.higher[keyed[value][0]] + int(replies[index]) + 1
        for value, index in rank_queries.items()
    }

    for player_id, (first, pairs) in pending.items():
        me = located[player_id]
        first_score = pairs[0][1]
        if first == 1:
            rank_first = 1
        elif first_score == value_of[player_id]:
            rank_first = me.rank
        else:
            rank_first = rank_of_score[first_score]
        window = ranked_values(pairs, first_position=first, rank_of_first=rank_first)
        out[player_id] = PlayerRead(entry=me, window=tuple(window), radius=wanted[player_id])
    return out


def _bucket_ranges(counts: list[int], first: int, limit: int) -> list[tuple[int, int, int]]:
    """(bucket, start, stop) index ranges holding display positions first..first+limit-1."""
    located = locate_position(counts, first)
    if located is None or limit <= 0:
        return []
    bucket, index = located
    out: list[tuple[int, int, int]] = []
    remaining = limit
    while remaining > 0 and bucket >= 0:
        available = counts[bucket] - index
        if available > 0:
            take = min(available, remaining)
            out.append((bucket, index, index + take - 1))
            remaining -= take
        bucket -= 1
        index = 0
    return out


# ------------------------------------------------------------------------------ rounds


@dataclass(slots=True)
class Round:
    """What one process sends for one version, shared by all its sockets of the season."""

    version: int
    # ok | unavailable (no manifest: the views were lost) | failed (Redis error)
    status: str
    # The shared fields, serialized: with the full top, and with the diff against
    # version - 1 (None when that manifest is gone).
    full: str = ""
    diff: str | None = None
    manifest: Manifest | None = None


@dataclass(slots=True)
class PlayerBatch:
    """The second half of a round: every subscribed player of the process, one batch.

    `players` is None when the version was superseded before they could be read (player
    sockets then skip it and get the next one) or the read failed."""

    players: dict[str, PlayerRead] | None
    round_trips: int = 0
    read_ms: float = 0.0


def round_build(season_slug: str, state: str | None, final_version: int | None, manifest: Manifest,
                previous: Manifest | None) -> Round:
    """The shared half of a round: the version's fields and top, serialized once per process."""
    base: dict[str, Any] = {
        "type": "version", "season_id": season_slug, "state": state, "final_version": final_version,
        "leaderboard_version": manifest.version, "as_of": manifest.as_of, "total_players": manifest.total,
    }
    top = manifest.top[:TOP_LIMIT]
    full = orjson.dumps({**base, "top": top}).decode()
    diff = None
    if previous is not None:
        change = top_diff(previous.top[:TOP_LIMIT], top)
        diff = orjson.dumps({**base, "top_diff": {"base_version": previous.version, **change}}).decode()
    return Round(version=manifest.version, status="ok", full=full, diff=diff, manifest=manifest)


# ----------------------------------------------------------------------------- snapshots


@dataclass(frozen=True, slots=True)
class Snapshot:
    manifest: Manifest
    top: list[dict[str, Any]]
    player: PlayerRead | None


def snapshot_read(season_slug: str, subscription: Subscription) -> Snapshot | None:
    """The current version for one socket (on connect and on request); None: unavailable.

    Top and player come from the one manifest the reader chose: the top 100 lives in it.
    """
    reader = leaderboard_reader(season_slug=season_slug)
    try:
        if subscription.player_id is None:
            manifest, top = reader.top(TOP_LIMIT)
            return Snapshot(manifest=manifest, top=top, player=None)
        manifest, me, window = reader.neighbors(subscription.player_id, subscription.radius)
        return Snapshot(manifest=manifest, top=manifest.top[:TOP_LIMIT],
                        player=PlayerRead(entry=me, window=tuple(window), radius=subscription.radius))
    except rankview.Unavailable:
        return None


def snapshot_message(season_slug: str, state: str | None, final_version: int | None, snapshot: Snapshot,
                     subscription: Subscription) -> dict[str, Any]:
    manifest = snapshot.manifest
    message: dict[str, Any] = {
        "type": "snapshot", "season_id": season_slug, "state": state, "final_version": final_version,
        "leaderboard_version": manifest.version, "as_of": manifest.as_of, "total_players": manifest.total,
        "top": snapshot.top,
    }
    if subscription.player_id is not None and snapshot.player is not None:
        message["player"] = player_payload(subscription.player_id, snapshot.player.entry,
                                           snapshot.player.window, subscription.radius)
    return message


def unavailable_message(season_slug: str, state: str | None, final_version: int | None) -> dict[str, Any]:
    """The read API's 503 body as a socket message: the same reason and retry_after."""
    refusal = read_unavailable()
    return {
        "type": refusal.code, "season_id": season_slug, "state": state, "final_version": final_version,
        "retry_after": refusal.retry_after,
        "detail": f"{refusal.detail}; the next published version is pushed to this socket",
    }


# ------------------------------------------------------------------------------ registry


@dataclass(slots=True)
class HubStats:
    rounds: int = 0
    players_read: int = 0
    round_trips: int = 0
    announcements: int = 0
    dropped: int = 0  # inbox entries a socket had not taken yet when a newer one came


@dataclass(slots=True)
class Socket:
    """One live socket as the hub sees it: what it wants, and its inbox of announcements."""

    subscription: Subscription
    inbox: asyncio.Queue[dict[str, Any]]


@dataclass(slots=True)
class SeasonHub:
    """The live sockets of one season in this process, its group listener, and its rounds.

    The process joins the season's group once, with one channel of its own (the
    listener), not once per socket: an announcement is one Redis message per process and
    is handed to each socket's inbox in memory. Sockets therefore cost the channel layer
    nothing to open or close. Rounds read Redis with the process's asyncio client, in the
    event loop.
    """

    slug: str
    redis: redis.asyncio.Redis
    keys: rankview.Keys
    sockets: dict[str, Socket] = field(default_factory=dict)
    # The newest version announced to this process.
    latest: int = 0
    rounds: dict[int, RoundTasks] = field(default_factory=dict)
    manifests: dict[int, Manifest] = field(default_factory=dict)
    stats: HubStats = field(default_factory=HubStats)
    listener: asyncio.Task[None] | None = None
    joined: asyncio.Event = field(default_factory=asyncio.Event)

    def wanted(self) -> dict[str, int]:
        """Subscribed players -> the widest radius asked for them in this process."""
        out: dict[str, int] = {}
        for socket in self.sockets.values():
            player_id = socket.subscription.player_id
            if player_id is not None:
                out[player_id] = max(out.get(player_id, 0), socket.subscription.radius)
        return out

    def note(self, version: int) -> None:
        self.latest = max(self.latest, version)

    def announce(self, event: dict[str, Any]) -> None:
        """Hand an announcement to every socket of the season in this process. Never waits:
        a socket whose inbox is full (it is stuck sending) loses its oldest entry, which a
        newer version supersedes anyway."""
        self.stats.announcements += 1
        if "version" in event:
            self.note(int(event["version"]))
        for socket in self.sockets.values():
            if socket.inbox.full():
                socket.inbox.get_nowait()
                self.stats.dropped += 1
            socket.inbox.put_nowait(event)

    def round(self, event: Mapping[str, Any]) -> RoundTasks:
        """The process's round for the event's version, started by the first socket asking.

        Two tasks: the shared half (manifests, the serialized top), then the player half.
        Sockets without a player are sent as soon as the first is done."""
        version = int(event["version"])
        tasks = self.rounds.get(version)
        if tasks is None:
            shared = asyncio.ensure_future(self._shared(event))
            tasks = RoundTasks(shared=shared, players=asyncio.ensure_future(self._players(shared, self.wanted())))
            self.rounds[version] = tasks
            for old in sorted(self.rounds)[:-ROUNDS_KEPT]:
                del self.rounds[old]
        return tasks

    async def manifest(self, version: int) -> Manifest | None:
        """A published manifest (immutable, version numbers are never reused): cached."""
        found = self.manifests.get(version)
        if found is None:
            raw = await self.redis.get(self.keys.manifest(version))
            if raw is None:
                return None
            found = self.manifests[version] = Manifest.from_json(raw)
            for old in sorted(self.manifests)[:-ROUNDS_KEPT]:
                del self.manifests[old]
        return found

    async def _shared(self, event: Mapping[str, Any]) -> Round:
        version = int(event["version"])
        try:
            manifest = await self.manifest(version)
            if manifest is None:
                return Round(version=version, status="unavailable")
            previous = await self.manifest(version - 1) if version > 1 else None
        except Exception:
            log.exception("live: round for version %s of %s failed", version, self.slug)
            return Round(version=version, status="failed")
        self.stats.rounds += 1
        return round_build(self.slug, event.get("state"), event.get("final_version"), manifest, previous)

    async def _players(self, shared: asyncio.Task[Round], wanted: dict[str, int]) -> PlayerBatch:
        result = await asyncio.shield(shared)
        if result.manifest is None:
            return PlayerBatch(players=None)
        if not wanted:
            return PlayerBatch(players={})
        started = time.monotonic()
        try:
            players, trips = await players_read_async(self.redis, self.keys, result.manifest, wanted)
        except rankview.Torn:
            log.info("live: version %s of %s was superseded before its players were read", result.version,
                     self.slug)
            return PlayerBatch(players=None)
        except Exception:
            log.exception("live: player reads for version %s of %s failed", result.version, self.slug)
            return PlayerBatch(players=None)
        self.stats.players_read += len(wanted)
        self.stats.round_trips += trips
        return PlayerBatch(players=players, round_trips=trips, read_ms=(time.monotonic() - started) * 1000)

    async def player_one(self, manifest: Manifest, player_id: str, radius: int) -> PlayerRead | None:
        """One player in a round's version, for a socket that subscribed after the round began."""
        try:
            reads, _ = await players_read_async(self.redis, self.keys, manifest, {player_id: radius})
        except rankview.Torn:
            return None
        except Exception:
            log.exception("live: read of %s in version %s of %s failed", player_id, manifest.version, self.slug)
            return None
        return reads[player_id]


@dataclass(frozen=True, slots=True)
class RoundTasks:
    shared: asyncio.Task[Round]
    players: asyncio.Task[PlayerBatch]


async def _listen(hub: SeasonHub) -> None:
    """The process's member of the season's group: receive announcements, hand them out.

    A Redis error does not end it: it waits (backing off), re-joins and goes on. A second
    task re-joins every `group_refresh_seconds`, since a group Redis lost or expired would
    otherwise stay silent. The receive itself is never cancelled except at shutdown: a
    receive cancelled as its message arrives could lose it.
    """
    layer = get_channel_layer()
    if layer is None:
        hub.joined.set()
        return
    group = season_group(hub.slug)
    channel = await layer.new_channel(prefix="live")
    refresher: asyncio.Task[None] | None = None
    backoff = 0.1
    warned_timeout = False
    try:
        while True:
            try:
                await layer.group_add(group, channel)
                hub.joined.set()
                if refresher is None:
                    refresher = asyncio.ensure_future(_rejoin_periodically(layer, group, channel))
                while True:
                    hub.announce(await layer.receive(channel))
                    backoff = 0.1
            except asyncio.CancelledError:
                raise
            except redis.exceptions.TimeoutError:
                # channels-redis polls with BZPOPMIN for 5 s; a Redis client that times reads
                # out after 5 s too (redis-py 8's default) fails every idle poll. Harmless
                # here (the loop goes on), but it is a configuration error: say so once.
                if not warned_timeout:
                    warned_timeout = True
                    log.warning("live: the channel layer's Redis read timeout is not longer than its 5 s "
                                "poll; set socket_timeout > 5 in CHANNEL_LAYERS hosts (README: Live boards)")
            except Exception:
                log.warning("live: listener of %s failed; re-joining in %.1fs", hub.slug, backoff, exc_info=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
    finally:
        hub.joined.clear()
        if refresher is not None:
            refresher.cancel()
        with contextlib.suppress(Exception):
            await layer.group_discard(group, channel)


async def _rejoin_periodically(layer: Any, group: str, channel: str) -> None:
    while True:
        await asyncio.sleep(group_refresh_seconds())
        try:
            await layer.group_add(group, channel)
        except Exception:
            log.warning("live: could not re-join %s", group, exc_info=True)


class LiveRegistry:
    """Per-process (per event loop) registry of live sockets, by season."""

    def __init__(self) -> None:
        self.hubs: dict[str, SeasonHub] = {}
        self._redis: redis.asyncio.Redis | None = None

    def redis(self) -> redis.asyncio.Redis:
        """The process's asyncio Redis client for rounds. A blocking pool: a burst of reads
        waits for a connection instead of failing (redis-py's default pool raises)."""
        if self._redis is None:
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                settings.REDIS_URL, max_connections=ASYNC_REDIS_CONNECTIONS, timeout=10,
                socket_timeout=5.0, socket_connect_timeout=2.0)
            self._redis = redis.asyncio.Redis(connection_pool=pool)
        return self._redis

    async def join(self, season_slug: str, socket_id: str, socket: Socket) -> SeasonHub:
        """Register a socket; returns once the process is in the season's group, so a version
        published after this returns is announced to the socket. Raises TimeoutError when the
        group cannot be joined within JOIN_TIMEOUT_SECONDS (Redis down); the socket is then
        not registered."""
        hub = self.hubs.get(season_slug)
        if hub is None:
            hub = self.hubs[season_slug] = SeasonHub(
                slug=season_slug, redis=self.redis(), keys=rankview.Keys(settings.REDIS_KEY_PREFIX, season_slug))
        hub.sockets[socket_id] = socket
        if hub.listener is None or hub.listener.done():
            hub.listener = asyncio.ensure_future(_listen(hub))
        try:
            async with asyncio.timeout(JOIN_TIMEOUT_SECONDS):
                await hub.joined.wait()
        except TimeoutError:
            self.leave(season_slug, socket_id)
            raise
        return hub

    def leave(self, season_slug: str, socket_id: str) -> None:
        hub = self.hubs.get(season_slug)
        if hub is None:
            return
        hub.sockets.pop(socket_id, None)
        if not hub.sockets:
            del self.hubs[season_slug]
            if hub.listener is not None:
                hub.listener.cancel()


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveRegistry] = weakref.WeakKeyDictionary()


def registry() -> LiveRegistry:
    """The registry of the running event loop: rounds and listeners are tasks of that loop."""
    loop = asyncio.get_running_loop()
    found = _registries.get(loop)
    if found is None:
        found = _registries[loop] = LiveRegistry()
    return found
