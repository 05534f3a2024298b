"""Live boards over websockets (CONTRACT.md 6): publication, per-process fan-out, batched reads.

One published version reaches the sockets like this:

1. The epoch swaps the pointer to version V, records it, and (on commit) calls
   `live_version_published`: ONE `channel_layer.group_send` to the season's group
   `live.{season}` carrying only {version, state}. channels-redis stores that message
   once per server process (its group_send groups the channels of one process under one
   Redis key), not once per socket.
2. In each server process the first socket that receives V starts the process's *round*
   for V (`SeasonHub.round`): one worker thread reads the manifest of V and of V-1 (both
   cached per process), serializes the part of the message every socket shares twice
   (full top 100, and the diff against V-1), and reads rank and neighbours of every player
   subscribed in this process in four pipelined Redis round trips (`players_read`),
   whatever the number of players. Every other socket of the process awaits the same
   round; a player nobody in the process watches is never read.
3. Each socket splices its own few fields (its `previous_version`, its player's entry,
   neighbours and events) onto the shared text and sends it, bounded by a send timeout:
   a slow client is dropped (close 4408) instead of holding anything others wait for.

Per process means per event loop: a uvicorn worker has one; tests create one per test.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from leaderboard import rankview
from leaderboard.core.epoch import locate_position
from leaderboard.core.live import TOP_LIMIT, Subscription, player_payload, top_diff
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry, ranked
from leaderboard.redis_client import redis_get
from leaderboard.selectors import leaderboard_reader
from seasons.models import Season

log = logging.getLogger(__name__)

GROUP_PREFIX = "live"
# Rounds a process keeps per season: a socket that is a few versions behind still finds
# its version's round; anything older is superseded anyway (sockets skip it).
ROUNDS_KEPT = 4
# The type of the group message, routed by Channels to LiveBoardConsumer.live_version.
VERSION_EVENT = "live.version"
# Group joins and leaves in flight per process. channels-redis takes one connection from
# its per-process pool for each, and redis-py's asyncio pool (100 connections) raises
# instead of waiting when it runs out: a thousand sockets connecting or closing at once
# would fail. Queued here, they wait their turn.
LAYER_CONCURRENCY = 32


def send_timeout() -> float:
    """How long one send to one socket may wait for the client to drain its buffer."""
    return float(getattr(settings, "LIVE_SEND_TIMEOUT_SECONDS", 5.0))


def group_refresh_seconds() -> float:
    """channels-redis forgets group members after `group_expiry` (a day by default): a socket
    open longer re-adds itself this often."""
    return float(getattr(settings, "LIVE_GROUP_REFRESH_SECONDS", 3600.0))


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


def players_read(r: redis.Redis, keys: rankview.Keys, manifest: Manifest,
                 wanted: Mapping[str, int]) -> tuple[dict[str, PlayerRead], int]:
    """Rank and neighbours of many players in one version, in four pipelined round trips.

    `wanted` maps player_id -> radius. Returns the reads and the number of round trips.
    Raises rankview.Torn when the manifest's copy no longer holds the version after the
    reads (it was superseded and its grace period passed): nothing read is then trusted.
    The last round trip re-reads the copy's generation and version after every data read
    (Redis runs one command at a time, and each round trip starts after the previous one
    answered), the same seqlock the single-player reads of RankReader use.
    """
    if not wanted:
        return {}, 0
    layout = manifest.layout
    copy = manifest.copy

    def bucket_key(bucket: int) -> str:
        return keys.bucket(copy, layout.layout_id, bucket)

    # 1. Scores from the copy's lookup: one HMGET per lookup shard.
    scores = rankview.copy_scores_get(r, keys, copy, list(wanted))
    found = [(player_id, score) for player_id, score in scores.items() if score is not None]

    # 2. Strictly higher players and the index of each found player in its bucket.
    located: dict[str, Entry] = {}
    if found:
        with r.pipeline(transaction=False) as pipe:
            for player_id, score in found:
                key = bucket_key(layout.bucket_of(score))
                pipe.zcount(key, "-inf", f"({-score}")
                pipe.zrank(key, player_id)
            replies = pipe.execute()
        for i, (player_id, score) in enumerate(found):
            higher, index = replies[2 * i], replies[2 * i + 1]
            if index is None:
                raise rankview.Torn()  # the lookup and the index disagree: mid-mutation
            before = manifest.higher[layout.bucket_of(score)]
            located[player_id] = Entry(position=before + int(index) + 1, rank=before + int(higher) + 1,
                                       player_id=player_id, score=score)

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
    pairs_of: list[list[tuple[str, int]]] = []
    if ranges:
        with r.pipeline(transaction=False) as pipe:
            for bucket, start, stop in ranges:
                pipe.zrange(bucket_key(bucket), start, stop, withscores=True)
            pairs_of = [[(m.decode(), -int(s)) for m, s in reply] for reply in pipe.execute()]

    # 4. The rank of each window's first entry when it is not known already (it is for
    #    position 1 and when it shares the player's score), then the seqlock check.
    pending: dict[str, tuple[int, list[tuple[str, int]]]] = {}
    rank_queries: dict[int, int] = {}
    for player_id, (first, last, spans) in windows.items():
        pairs = [pair for span in spans for pair in pairs_of[ranges[span]]]
        me = located[player_id]
        if len(pairs) != last - first + 1 or pairs[me.position - first] != (player_id, me.score):
            raise rankview.Torn()  # a bucket holds other members than the manifest counted
        pending[player_id] = (first, pairs)
        first_score = pairs[0][1]
        if first != 1 and first_score != me.score:
            rank_queries.setdefault(first_score, len(rank_queries))
    with r.pipeline(transaction=False) as pipe:
        for score in rank_queries:
            pipe.zcount(bucket_key(layout.bucket_of(score)), "-inf", f"({-score}")
        pipe.hmget(keys.copy_meta(copy), ["gen", "version"])
        replies = pipe.execute()
    gen, version = replies[-1]
    if gen is None or version is None or int(gen) != manifest.gen or int(version) != manifest.version:
        raise rankview.Torn()
    rank_of_score = {
        score: manifest.higher[layout.bucket_of(score)] + int(replies[index]) + 1
        for score, index in rank_queries.items()
    }

    out = {player_id: PlayerRead(entry=None, radius=radius) for player_id, radius in wanted.items()}
    for player_id, (first, pairs) in pending.items():
        me = located[player_id]
        first_score = pairs[0][1]
        if first == 1:
            rank_first = 1
        elif first_score == me.score:
            rank_first = me.rank
        else:
            rank_first = rank_of_score[first_score]
        window = ranked(pairs, first_position=first, rank_of_first=rank_first)
        out[player_id] = PlayerRead(entry=me, window=tuple(window), radius=wanted[player_id])
    return out, 4 if found else 2


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
    # Player reads of the process's subscribers; None when the version was superseded
    # before they could be read (player sockets then skip it and get the next one).
    players: dict[str, PlayerRead] | None = None
    manifest: Manifest | None = None
    round_trips: int = 0
    read_ms: float = 0.0


def round_read(season_slug: str, version: int, state: str | None, final_version: int | None,
               wanted: Mapping[str, int]) -> Round:
    """The blocking part of a round, run in a worker thread."""
    started = time.monotonic()
    r = redis_get()
    keys = rankview.Keys(settings.REDIS_KEY_PREFIX, season_slug)
    manifest = rankview.manifest_get(r, keys, version)
    if manifest is None:
        return Round(version=version, status="unavailable")
    base: dict[str, Any] = {
        "type": "version", "season_id": season_slug, "state": state, "final_version": final_version,
        "leaderboard_version": manifest.version, "as_of": manifest.as_of, "total_players": manifest.total,
    }
    top = manifest.top[:TOP_LIMIT]
    full = orjson.dumps({**base, "top": top}).decode()
    previous = rankview.manifest_get(r, keys, version - 1) if version > 1 else None
    diff = None
    if previous is not None:
        change = top_diff(previous.top[:TOP_LIMIT], top)
        diff = orjson.dumps({**base, "top_diff": {"base_version": previous.version, **change}}).decode()
    players: dict[str, PlayerRead] | None
    try:
        players, trips = players_read(r, keys, manifest, wanted)
    except rankview.Torn:
        log.info("live: version %s of %s was superseded before its players were read", version, season_slug)
        players, trips = None, 0
    return Round(version=version, status="ok", full=full, diff=diff, players=players, manifest=manifest,
                 round_trips=trips, read_ms=(time.monotonic() - started) * 1000)


def player_read_one(season_slug: str, manifest: Manifest, player_id: str, radius: int) -> PlayerRead | None:
    """One player in a round's version, for a socket that subscribed after the round began."""
    keys = rankview.Keys(settings.REDIS_KEY_PREFIX, season_slug)
    try:
        reads, _ = players_read(redis_get(), keys, manifest, {player_id: radius})
    except rankview.Torn:
        return None
    return reads[player_id]


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
    retry = max(1, round(float(settings.EPOCH_SECONDS)))
    return {
        "type": "unavailable", "season_id": season_slug, "state": state, "final_version": final_version,
        "retry_after": retry,
        "detail": "no complete leaderboard version is published (yet, or the views are being rebuilt); "
                  "the next published version is pushed to this socket",
    }


# ------------------------------------------------------------------------------ registry


@dataclass(slots=True)
class HubStats:
    rounds: int = 0
    players_read: int = 0
    round_trips: int = 0


@dataclass(slots=True)
class SeasonHub:
    """The sockets of one season in this process, and its rounds."""

    slug: str
    sockets: dict[str, Subscription] = field(default_factory=dict)
    # The newest version any socket of this process was told about.
    latest: int = 0
    rounds: dict[int, asyncio.Task[Round]] = field(default_factory=dict)
    stats: HubStats = field(default_factory=HubStats)

    def wanted(self) -> dict[str, int]:
        """Subscribed players -> the widest radius asked for them in this process."""
        out: dict[str, int] = {}
        for sub in self.sockets.values():
            if sub.player_id is not None:
                out[sub.player_id] = max(out.get(sub.player_id, 0), sub.radius)
        return out

    def note(self, version: int) -> None:
        self.latest = max(self.latest, version)

    def round(self, event: Mapping[str, Any]) -> asyncio.Task[Round]:
        version = int(event["version"])
        task = self.rounds.get(version)
        if task is None:
            task = asyncio.ensure_future(self._round(event, self.wanted()))
            self.rounds[version] = task
            for old in sorted(self.rounds)[:-ROUNDS_KEPT]:
                del self.rounds[old]
        return task

    async def _round(self, event: Mapping[str, Any], wanted: dict[str, int]) -> Round:
        version = int(event["version"])
        try:
            # Not thread_sensitive: Redis reads need no Django thread, and the one shared
            # sync thread is where every database call of the process queues.
            result = await sync_to_async(round_read, thread_sensitive=False)(
                self.slug, version, event.get("state"), event.get("final_version"), wanted)
        except Exception:
            log.exception("live: round for version %s of %s failed", version, self.slug)
            return Round(version=version, status="failed")
        self.stats.rounds += 1
        self.stats.players_read += len(wanted)
        self.stats.round_trips += result.round_trips
        return result


class LiveRegistry:
    """Per-process (per event loop) registry of live sockets, by season."""

    def __init__(self) -> None:
        self.hubs: dict[str, SeasonHub] = {}
        self.layer_gate = asyncio.Semaphore(LAYER_CONCURRENCY)

    def join(self, season_slug: str, channel_name: str, subscription: Subscription) -> SeasonHub:
        hub = self.hubs.get(season_slug)
        if hub is None:
            hub = self.hubs[season_slug] = SeasonHub(slug=season_slug)
        hub.sockets[channel_name] = subscription
        return hub

    def leave(self, season_slug: str, channel_name: str) -> None:
        hub = self.hubs.get(season_slug)
        if hub is None:
            return
        hub.sockets.pop(channel_name, None)
        if not hub.sockets:
            del self.hubs[season_slug]


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveRegistry] = weakref.WeakKeyDictionary()


def registry() -> LiveRegistry:
    """The registry of the running event loop: rounds are asyncio tasks of that loop."""
    loop = asyncio.get_running_loop()
    found = _registries.get(loop)
    if found is None:
        found = _registries[loop] = LiveRegistry()
    return found
