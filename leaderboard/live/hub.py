"""Live boards over websockets (docs/architecture.md, Live boards): publication, per-process fan-out, batched reads.

One published version reaches the sockets like this:

1. The epoch swaps the pointer to version V, records it, and (on commit) calls
   `live_version_published`: ONE `channel_layer.group_send` to the season's group
   `live.{season}` carrying only {version, state}.
2. The members of that group are server processes, not sockets: each process that has
   sockets of the season runs one listener (`_listen`) with one channel in the group, so
   the announcement is one small Redis message per process, handed to the process's
   `SeasonHub` of the season.
3. The hub runs one *round* per version (`SeasonHub._publish`), read with the process's
   asyncio Redis client in the event loop (a worker thread would fight the loop for the
   GIL while it sends): the manifests of V and V-1 (cached), the part of the message
   every socket shares serialized twice (full top 100, and the diff against V-1); then
   rank and neighbours of every player subscribed in this process in at most four
   pipelined round trips (`players_plan`), whatever their number. Announcements that come
   while a round is being sent are coalesced into one round of the newest.
4. The hub sends each socket its message itself, in one pass over the sockets
   (`_fan_out`): sockets without a player first (while the players are read), each
   group of them that last sent the same version with one shared text; then each socket
   with a player, its own few fields spliced onto the shared text. A send is run in the
   hub's task until it completes, which the server's send does at once unless the
   client stopped reading (`send_started`), so the fan-out costs no task, future or
   timer per socket. A send that has to wait goes on in a task of its own bounded by
   the send timeout: a slow client is dropped (close 4408) instead of holding anything
   others wait for, and one that catches up gets the newest version (`catch_up`).
5. A watcher checks the season's pointer when no announcement came for a few seconds:
   views found lost (a flushed Redis) are said to every socket ("unavailable", with the
   running recovery's progress, repeated as it advances), and a version whose
   announcement was lost is published to the sockets all the same.

Per process means per event loop: a uvicorn worker has one; tests create one per test.
A region's board (a socket's `?region=`) has a hub of its own beside the global board's,
with its own listener in the same group: each reads the announced version's manifest and
serves its board of it (`Manifest.board_of`), so the global hub's rounds are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import weakref
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import redis
import redis.asyncio
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from leaderboard.core.epoch import bucket_place, bucket_ranges, bucket_rank
from leaderboard.core.gc_pause import gc_paused
from leaderboard.core.live import (
    TOP_LIMIT,
    PlayerMark,
    Subscription,
    board_fields,
    player_payload,
    recovery_payload,
    top_diff,
    version_text,
)
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry, ranked_values
from leaderboard.core.shared_index import entry_player
from leaderboard.core.slots import bucket_group, shard_group
from leaderboard.core.tiebreak import IndexValue, index_key, index_value, lookup_value, value_score
from leaderboard.models import ACTIVE_REBUILD_STATUSES, RebuildJob
from leaderboard.redis_client import cluster_outage, cluster_unreachable
from leaderboard.views import rankview
from leaderboard.views.rankview.reads import board_entry, seqlock_commands, seqlock_holds
from leaderboard.views.rankview.shared import ahead_call, place_call, window_call
from leaderboard.views.rankview.wire import slot_batches
from leaderboard.views.selectors import leaderboard_reader, read_unavailable
from seasons.models import Season

log = logging.getLogger(__name__)

GROUP_PREFIX = "live"
# Manifests a process keeps per season: the current version's and the one before (its
# diff base), and a few more for a socket that is a version or two behind.
MANIFESTS_KEPT = 4
# The type of the group message.
VERSION_EVENT = "live.version"
# Control messages a socket's consumer may have waiting (only live.slow today).
INBOX_SIZE = 8
JOIN_TIMEOUT_SECONDS = 10.0
ASYNC_REDIS_CONNECTIONS = 16
# The bound of one read (a round trip) of the hub's Redis client.
REDIS_READ_TIMEOUT_SECONDS = 5.0
# Sockets sent to between two yields to the event loop: a fan-out to 10,000 sockets
# must not hold the loop (handshakes, client messages, the listener) for its whole length.
FAN_OUT_SLICE = 512
# Without an announcement for this long the hub checks the season's pointer itself.
VIEWS_CHECK_SECONDS = 2.0
# The bound of the listener's group_discard when it stops (the group forgets the channel
# after its expiry anyway).
GROUP_DISCARD_TIMEOUT_SECONDS = 2.0
# How long a stopped hub's task gets to end after a cancellation before it is cancelled
# again (`tasks_stop`): longer than the listener's way out, whose group_discard a second
# cancellation would cut short.
TASK_STOP_RETRY_SECONDS = GROUP_DISCARD_TIMEOUT_SECONDS + 1.0


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


def live_version_published(season_slug: str, version: int, state: str | None = None,
                           final_version: int | None = None, **_: object) -> None:
    """Tell every live socket of the season that `version` is published: one group_send.

    Connected to the views' `version_published` signal (LeaderboardConfig.ready), sent
    after the publishing transaction commits with the season's state. It must never fail
    the epoch: the version is published whether or not anyone is told, and a socket that
    misses it catches up with the next one (full top, events since what it last sent).
    """
    try:
        layer = get_channel_layer()
        if layer is None:
            return
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


# A Redis command: its name and arguments (str, bytes or int), its reply taken raw (no
# redis-py callback applies to these commands' replies but ZRANGE's, which is why the plan
# sends it without the withscores option it would need).
Call = tuple[Any, ...]
Plan = Generator[list[Call], list[Any], dict[str, "PlayerRead"]]


def players_read(r: redis.Redis, keys: rankview.Keys, manifest: Manifest,
                 wanted: Mapping[str, int]) -> tuple[dict[str, PlayerRead], int]:
    """`players_plan` on a sync client: (reads, round trips). Raises rankview.Torn."""
    plan = players_plan(keys, manifest, wanted)
    trips = 0
    try:
        calls = next(plan)
        while True:
            replies = rankview.round_trip(r, calls)
            trips += 1
            calls = plan.send(replies)
    except StopIteration as done:
        return done.value, trips


async def players_read_async(r: redis.asyncio.Redis, keys: rankview.Keys, manifest: Manifest,
                             wanted: Mapping[str, int]) -> tuple[dict[str, PlayerRead], int]:
    """`players_plan` on an asyncio client, in the event loop: no worker thread to contend
    for the GIL with the loop that is sending the same version to other sockets. Each
    round trip is bounded by REDIS_READ_TIMEOUT_SECONDS as a whole (the process's client
    has no per-reply timeout: that was a timer per reply, thousands per round)."""
    plan = players_plan(keys, manifest, wanted)
    trips = 0
    try:
        calls = next(plan)
        while True:
            async with asyncio.timeout(REDIS_READ_TIMEOUT_SECONDS):
                replies = await pipeline_raw(r, calls)
            trips += 1
            calls = plan.send(replies)
    except StopIteration as done:
        return done.value, trips


async def pipeline_raw(r: redis.asyncio.Redis, commands: list[Call]) -> list[Any]:
    """One round trip of commands on a connection of the client's pool, packed into one
    buffer here and the replies read as the parser gives them.

    redis-py's pipeline packs each command and runs each reply through its callbacks in
    Python: with a few thousand commands per round that was half the cost of reading a
    version's players. A reply that is an error raises (the connection is dropped, since
    the replies after it are unread), like the pipeline's execute. On a cluster client the
    commands go to their slots' masters, all at once (`_nodes_pipeline_raw`).
    """
    if isinstance(r, redis.asyncio.RedisCluster):
        return await _nodes_pipeline_raw(r, commands)
    pool = r.connection_pool
    connection = await pool.get_connection()
    try:
        await connection.send_packed_command(resp_pack(commands), check_health=False)
        return [await connection.read_response() for _ in commands]
    except BaseException:
        await connection.disconnect()
        raise
    finally:
        await pool.release(connection)


async def _nodes_pipeline_raw(r: redis.asyncio.RedisCluster, commands: list[Call]) -> list[Any]:
    """`pipeline_raw` on a cluster: the commands grouped by the master of their slot (in
    order within a node, so the seqlock's reads of a slot group run after the group's
    data reads), every node's batch written before any reply is read. A stale slot map
    (a failover) drops the connections, refreshes the map and fails the round: the
    round's caller reads the next version or retries. No node answering is a redis
    ConnectionError, as on the sync client (redis_client.cluster_outage)."""
    await _cluster_call(r.initialize())
    nodes = r.nodes_manager
    batches = slot_batches(nodes, commands)
    taken = []
    try:
        # Nodes in one order for every round, so two rounds waiting for connections never
        # each hold the other's.
        for name, ats in sorted(batches.items()):
            node = r.get_node(node_name=name)
            assert node is not None
            connection = await _connection_acquire(node)
            taken.append((node, connection, ats))
            await connection.send_packed_command(resp_pack([commands[at] for at in ats]), check_health=False)
        replies: list[Any] = [None] * len(commands)
        for _, connection, ats in taken:
            for at in ats:
                replies[at] = await connection.read_response()
        return replies
    except BaseException as exc:
        for _, connection, _ in taken:
            await connection.disconnect()
        if isinstance(exc, redis.exceptions.RedisError):
            await _cluster_call(nodes.initialize())
        raise
    finally:
        for node, connection, _ in taken:
            node.release(connection)


async def _cluster_call(call: Awaitable[Any]) -> Any:
    """An asyncio cluster client's call that may find no node or slot available: then the
    outage every caller already handles (redis ConnectionError), not RedisClusterException."""
    try:
        return await call
    except redis.exceptions.RedisClusterException as exc:
        if not cluster_unreachable(exc):
            raise
        raise cluster_outage(exc) from exc


async def _connection_acquire(node: Any) -> Any:
    """A connection of a cluster node's pool (ASYNC_REDIS_CONNECTIONS at most): when all are
    in use, wait for one as the plain client's blocking pool does (the round's timeout
    bounds the wait), instead of failing the round."""
    while True:
        try:
            return node.acquire_connection()
        except redis.exceptions.MaxConnectionsError:
            await asyncio.sleep(0.002)


try:
    import hiredis

    _pack_command: Callable[..., bytes] | None = hiredis.pack_command
except ImportError:  # redis-py without hiredis
    _pack_command = None


def resp_pack(commands: list[Call]) -> bytes:
    """Commands in the Redis protocol (RESP arrays of bulk strings): hiredis's packer (C,
    half the time of the loop below on a round's thousands of commands) when it is there."""
    if _pack_command is not None:
        return b"".join(map(_pack_command, commands))
    out: list[bytes] = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def players_plan(keys: rankview.Keys, manifest: Manifest, wanted: Mapping[str, int]) -> Plan:
    """Rank and neighbours of many players in one version, in at most four pipelined round trips.

    A generator that yields the commands of each round trip and receives their replies (so
    the sync and the asyncio drivers share it). `wanted` maps player_id -> radius.
    Raises rankview.Torn when the manifest's copy no longer holds the version after the
    reads (it was superseded and its grace period passed): nothing read is then trusted.
    The last round trip re-reads the copy's generation and version after every data read
    (Redis runs one command at a time, and each round trip starts after the previous one
    answered), the same seqlock the single-player reads of RankReader use.
    On a region's board (`Manifest.board_of`) the reads are that board's, and a player
    whose region-shard entry names another board (or none) is not ranked on it.
    """
    out = {player_id: PlayerRead(entry=None, radius=radius) for player_id, radius in wanted.items()}
    if not wanted:
        return out
    layout = manifest.layout
    index_name = manifest.index
    groups = manifest.groups
    # The slot groups read, whose `gen` the last round trip checks (the seqlock).
    touched: set[int] = set()

    def bucket_key(bucket: int) -> str:
        touched.add(bucket_group(bucket=bucket, groups=groups, board=manifest.board))
        return keys.bucket(index_name, layout.layout_id, bucket, manifest.board, groups=groups)

    def hidden_key(bucket: int) -> str:
        return keys.hidden(index_name, manifest.side, layout.layout_id, bucket, manifest.board, groups=groups)

    # 1. Scores from the copy's lookup: one HMGET per lookup shard (the copy's count).
    shards = list(rankview.shards_of(wanted, manifest.lookup_shards).items())
    touched.update(shard_group(shard=shard, groups=groups) for shard, _ in shards)
    lookups: list[Call] = [("HMGET", keys.lookup(index_name, shard, groups=groups), *players)
                           for shard, players in shards]
    if manifest.board:
        # The players' regions in the same round trip; the global board never asks.
        lookups += [("HMGET", keys.region(index_name, shard, groups=groups), *players) for shard, players in shards]
    replies = yield lookups
    homes = replies[len(shards):] if manifest.board else [[None] * len(players) for _, players in shards]
    # Values: scores, or (score, reached_ms) on a first_reached board (core.tiebreak), as
    # the version's side sees them, with the name of the entry that holds each; on a
    # region's board only the players whose region entry names it.
    ties = manifest.ties
    found: list[tuple[str, IndexValue, str]] = []
    for (_, players), values, regions in zip(shards, replies[:len(shards)], homes, strict=True):
        for player_id, value, region in zip(players, values, regions, strict=True):
            _, on_board = board_entry(manifest, player_id, value, region)
            if on_board is not None:
                found.append((player_id, lookup_value(ties, on_board[0]), on_board[1]))

    # 2. Players ranked ahead and the index of each found player in its bucket.
    located: dict[str, Entry] = {}
    value_of: dict[str, IndexValue] = {}
    if found:
        calls: list[Call] = []
        buckets: list[int] = []
        for _, value, name in found:
            bucket, sort_key = index_key(layout, ties, value)
            buckets.append(bucket)
            calls.append(place_call(bucket=bucket_key(bucket), hidden=hidden_key(bucket), key=sort_key, name=name))
        replies = yield calls
        for i, (player_id, value, _) in enumerate(found):
            higher, index = replies[i]
            if index is None:
                raise rankview.Torn()  # the lookup and the index disagree: mid-mutation
            position, rank = bucket_place(manifest.higher, buckets[i], index=int(index), ahead=int(higher))
            value_of[player_id] = value
            located[player_id] = Entry(position=position, rank=rank, player_id=player_id, score=value_score(value))

    # 3. Each player's window of positions, as ranges of buckets; identical ranges (players
    #    near each other) are read once.
    windows: dict[str, tuple[int, int, list[tuple[int, int, int]]]] = {}
    ranges: dict[tuple[int, int, int], int] = {}
    for player_id, me in located.items():
        radius = wanted[player_id]
        first = max(1, me.position - radius)
        last = min(manifest.total, me.position + radius)
        spans = bucket_ranges(manifest.counts, first, last - first + 1)
        windows[player_id] = (first, last, spans)
        for span in spans:
            ranges.setdefault(span, len(ranges))
    pairs_of: list[list[tuple[str, IndexValue]]] = []
    if ranges:
        # The entries the version's side sees (entry names back to players).
        replies = yield [window_call(bucket=bucket_key(bucket), hidden=hidden_key(bucket), start=start,
                                     count=stop - start + 1) for bucket, start, stop in ranges]
        pairs_of = [[(entry_player(m.decode()), index_value(layout, ties, bucket, s))
                     for m, s in zip(reply[::2], reply[1::2], strict=True)]
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
    counts: list[Call] = [ahead_call(bucket=bucket_key(keyed[value][0]), hidden=hidden_key(keyed[value][0]),
                                     key=keyed[value][1]) for value in rank_queries]
    # The seqlock's reads after every data read (the earlier round trips answered before
    # this one was sent).
    replies = yield [*counts, *seqlock_commands(keys, manifest, sorted(touched))]
    if not seqlock_holds(manifest, replies[len(counts):]):
        raise rankview.Torn()
    rank_of_score = {
        value: bucket_rank(manifest.higher, keyed[value][0], int(replies[index][0]))
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


# ------------------------------------------------------------------------------ rounds


@dataclass(slots=True)
class Round:
    """What one process sends for one version, shared by all its sockets of the season."""

    version: int
    manifest: Manifest
    # The shared fields, serialized: with the full top, and with the diff against
    # version - 1 (None when that manifest is gone).
    full: str
    diff: str | None
    # Every subscribed player of the process in this version, read in one batch; None
    # until read, and when the version was superseded before they could be (player
    # sockets then skip it and get the next one).
    players: dict[str, PlayerRead] | None = None


def round_build(season_slug: str, state: str | None, final_version: int | None, manifest: Manifest,
                previous: Manifest | None) -> Round:
    """The shared half of a round: the version's fields and top, serialized once per process."""
    base: dict[str, Any] = {
        "type": "version", "season_id": season_slug, **board_fields(manifest.board), "state": state,
        "final_version": final_version, "leaderboard_version": manifest.version, "as_of": manifest.as_of,
        "total_players": manifest.total,
    }
    top = manifest.top[:TOP_LIMIT]
    full = orjson.dumps({**base, "top": top}).decode()
    diff = None
    if previous is not None:
        change = top_diff(previous.top[:TOP_LIMIT], top)
        diff = orjson.dumps({**base, "top_diff": {"base_version": previous.version, **change}}).decode()
    return Round(version=manifest.version, manifest=manifest, full=full, diff=diff)


# ---------------------------------------------------------------------------- sending


class _Rest:
    """The rest of a coroutine that `send_started` ran up to its first suspension.

    Awaiting it goes on where the coroutine stopped, as the task that would have run it
    from the start would have: every future it waits on is handed up to the awaiting task
    unchanged, and a cancellation (a timeout) is thrown into it.
    """

    __slots__ = ("coro", "waiting")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting: Any):
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, None, None]:
        waiting = self.waiting
        while True:
            try:
                yield waiting
            except BaseException as exc:  # noqa: BLE001 (a cancellation, passed on to the coroutine)
                try:
                    waiting = self.coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting = self.coro.send(None)
                except StopIteration:
                    return


def send_started(coro: Coroutine[Any, Any, None]) -> _Rest | None:
    """Run a send in the caller's task until it completes or first has to wait.

    None when it completed, the usual case: the server's send writes the frame to the
    connection's buffer and returns without waiting unless the client stopped reading.
    Then the caller awaits the returned rest in a task of its own, bounded by the send
    timeout, so one stuck client holds up nothing else. The fan-out therefore costs no
    task, future or timer per socket (3.12's eager tasks, in a few lines for 3.11). What
    the send raises before it waits (the client is gone) is raised here.
    """
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return _Rest(coro, waiting)


def text_frame(data: bytes) -> bytes:
    """A whole server-to-client text frame (RFC 6455 5.2: FIN, opcode 1, unmasked, no
    extension) carrying `data`, byte for byte what the server's own send writes for it
    on a connection without extensions. Built once per distinct text of a round, the same
    bytes then go to every socket that sends that text."""
    return _frame(0x81, data)


def _frame(head: int, payload: bytes) -> bytes:
    """A frame's header (first byte `head`, unmasked, RFC 6455's three length forms) and payload."""
    length = len(payload)
    if length < 126:
        return struct.pack("!BB", head, length) + payload
    if length < 65536:
        return struct.pack("!BBH", head, 126, length) + payload
    return struct.pack("!BBQ", head, 127, length) + payload


@dataclass(frozen=True, slots=True)
class Deflate:
    """permessage-deflate without server context takeover, with these zlib parameters."""

    window_bits: int
    settings: tuple[tuple[str, Any], ...] = ()


# How a connection's frames are made (`frame_kind`): PLAIN, or Deflate.
PLAIN = "plain"
FrameKind = str | Deflate


def frame_build(data: bytes, kind: FrameKind) -> bytes:
    """The frame of a text message on a connection of `kind`: `text_frame`, or its
    permessage-deflate frame (RFC 7692: RSV1 set, the message compressed from a fresh
    context, the sync flush's trailing 00 00 ff ff removed), byte for byte what the
    websockets library's extension writes on such a connection."""
    if not isinstance(kind, Deflate):
        return text_frame(data)
    encoder = zlib.compressobj(wbits=-kind.window_bits, **dict(kind.settings))
    return _frame(0xC1, (encoder.compress(data) + encoder.flush(zlib.Z_SYNC_FLUSH))[:-4])


class SplicedDeflate:
    """Deflated frames of the player sockets' texts, each a round's shared text with the
    socket's own fields spliced on (core.live.splice: the shared text up to its closing
    brace, a comma, then the socket's fields): the shared part is compressed once per
    round, and each socket's frame from a copy of that compressor, which then compresses
    only the socket's own fields. The stream differs from compressing the whole text in
    one go only in where zlib's output is cut, and decompresses to the same text."""

    def __init__(self, kind: Deflate, shared: tuple[str | None, ...]):
        self.kind = kind
        self.starts: list[tuple[str, bytes, Any]] = []
        for common in shared:
            if common and common.endswith("}"):
                prefix = common[:-1] + ","
                encoder = zlib.compressobj(wbits=-kind.window_bits, **dict(kind.settings))
                self.starts.append((prefix, encoder.compress(prefix.encode()), encoder))

    def frame(self, text: str) -> bytes:
        for prefix, head, encoder in self.starts:
            if text.startswith(prefix):
                copy = encoder.copy()
                body = head + copy.compress(text[len(prefix):].encode()) + copy.flush(zlib.Z_SYNC_FLUSH)
                return _frame(0xC1, body[:-4])
        return frame_build(text.encode(), self.kind)


try:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
    from websockets.extensions.permessage_deflate import PerMessageDeflate as _PerMessageDeflate
    from websockets.protocol import State as _WsState

    _SANSIO: type[Any] | None = WebSocketsSansIOProtocol
except ImportError:  # another server, or uvicorn without the sans-I/O implementation
    _SANSIO = None


def wire_of(send: Callable[..., Any]) -> Any | None:
    """The server connection behind an ASGI send when the fan-out may write frames to its
    transport itself: uvicorn's sans-I/O websocket protocol (its default implementation),
    whose send is a bound method of the connection. None for any other server or
    implementation (and the test communicator): those sockets get the ASGI send."""
    owner = getattr(send, "__self__", None)
    if _SANSIO is None or not isinstance(owner, _SANSIO):
        return None
    # What `wire_write` reads, checked once: a uvicorn or websockets release that renamed
    # any of it gets the ASGI send rather than a socket dropped by an AttributeError.
    conn = getattr(owner, "conn", None)
    if not (all(hasattr(owner, name) for name in _WIRE_FIELDS)
            and all(hasattr(conn, name) for name in ("state", "extensions", "writes"))):
        return None
    return owner


_WIRE_FIELDS = ("transport", "writable", "handshake_complete", "close_sent", "disconnected", "initial_response")


def frame_kind(wire: Any) -> FrameKind | None:
    """How frames for this connection are made, from the extensions its handshake
    negotiated (fixed from then on): PLAIN without any; a deflate kind for
    permessage-deflate without server context takeover (`live.protocol`), whose
    messages compress alike on every connection; None (the server's send compresses
    each socket's frames itself) for context takeover, uvicorn's default, or anything
    else."""
    extensions = wire.conn.extensions
    if not extensions:
        return PLAIN
    if len(extensions) == 1 and isinstance(extensions[0], _PerMessageDeflate):
        deflate = extensions[0]
        if deflate.local_no_context_takeover:
            return Deflate(deflate.local_max_window_bits, tuple(sorted(deflate.compress_settings.items())))
    return None


def wire_write(wire: Any, frame: bytes) -> bool:
    """Write a whole frame to an open connection's transport, as the server's send would;
    False (nothing written) whenever that send would do anything else: wait for the
    client to drain its buffer, raise for a closed or closing connection, refuse a
    message before the handshake. `frame` is of the connection's `frame_kind`. The
    connection's own writes are always whole frames written at once (its protocol object
    keeps none pending), so a frame written here never lands inside one of them."""
    conn = wire.conn
    if (not wire.handshake_complete or wire.close_sent or wire.disconnected or wire.initial_response is not None
            or not wire.writable.is_set() or conn.state is not _WsState.OPEN or conn.writes
            or wire.transport.is_closing()):
        return False
    wire.transport.write(frame)
    return True


# ------------------------------------------------------------------------------ sockets


@dataclass(slots=True, eq=False)
class Socket:
    """One live socket as its season's hub sees it: what it wants, what it was sent last,
    how to send to it, and who is sending to it now.

    `busy` is held by whoever has a send to this socket in flight: the socket's consumer
    from its registration until its first snapshot is sent and during each snapshot, or
    the hub while a send waits for a slow client. The hub's fan-out leaves a busy socket
    alone; whoever releases it brings it to the newest version (`SeasonHub.catch_up`).
    """

    subscription: Subscription
    # The server's ASGI send of this socket's connection.
    send: Callable[[dict[str, Any]], Coroutine[Any, Any, None]]
    # Control messages from the hub to the socket's consumer (live.slow: close it).
    inbox: asyncio.Queue[dict[str, Any]]
    # The version this socket last sent (the base of its next diff and events) and what it
    # said about its player then; None: nothing sent yet, or "unavailable".
    sent_version: int | None = None
    mark: PlayerMark | None = None
    # The "unavailable" message it last sent, while it shows one (so progress that did
    # not move is not sent again).
    unavailable: str | None = None
    busy: bool = True
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    # The server connection the fan-out writes frames to directly (`wire_of`), and how
    # they are made for it (`frame_kind`); None: it gets the ASGI send.
    wire: Any = None
    kind: FrameKind | None = None

    def __post_init__(self) -> None:
        wire = wire_of(self.send)
        self.kind = frame_kind(wire) if wire is not None else None
        self.wire = wire if self.kind is not None else None

    def sent(self, version: int, mark: PlayerMark | None) -> None:
        self.sent_version, self.mark, self.unavailable = version, mark, None

    def sent_unavailable(self, text: str) -> None:
        self.sent_version, self.mark, self.unavailable = None, None, text

    async def take(self) -> None:
        """Wait until no send to this socket is in flight, then hold it."""
        while self.busy:
            await self.idle.wait()
        self.hold()

    def hold(self) -> None:
        self.busy = True
        self.idle.clear()

    def release(self) -> None:
        self.busy = False
        self.idle.set()

    def message(self, text: str) -> dict[str, Any]:
        return {"type": "websocket.send", "text": text}


# ------------------------------------------------------------------------------ the hub


@dataclass(slots=True)
class HubStats:
    rounds: int = 0
    players_read: int = 0
    round_trips: int = 0
    announcements: int = 0
    skipped_busy: int = 0  # sockets a fan-out passed over because a send to them was in flight
    slow: int = 0  # sends that had to wait for their client
    direct: int = 0  # frames the fan-out wrote to a connection's transport itself (`wire_write`)
    dropped: int = 0  # sockets closed because their client did not take a frame in time


@dataclass(slots=True)
class SeasonHub:
    """The live sockets of one season in this process, its group listener, and its rounds.

    The process joins the season's group once, with one channel of its own (the
    listener), not once per socket: an announcement is one Redis message per process.
    The hub then reads the version once (`_publish`) and sends each socket its message
    itself, in one pass over the sockets: no task, queue or timer per socket and version
    (a task only for a socket whose client is not keeping up). Rounds read Redis with the
    process's asyncio client, in the event loop.
    """

    slug: str
    redis: redis.asyncio.Redis
    keys: rankview.Keys
    # The board this hub serves: a region's (Manifest.board_of), or None for the global one.
    # Each board of a season has its hub, fed by the season's announcements.
    region: str | None = None
    sockets: dict[str, Socket] = field(default_factory=dict)
    # The newest version announced to this process, the newest one published to its
    # sockets, and when the last announcement came (loop time).
    latest: int = 0
    published: int = 0
    heard_at: float = 0.0
    # The season's state as the last announcement (or the first socket) had it.
    state: str | None = None
    final_version: int | None = None
    # The newest round (None: none yet, or the views were found lost since).
    current: Round | None = None
    manifests: dict[int, Manifest] = field(default_factory=dict)
    stats: HubStats = field(default_factory=HubStats)
    listener: asyncio.Task[None] | None = None
    # The listener's periodic re-join of the season's group (`_rejoin_periodically`).
    refresher: asyncio.Task[None] | None = None
    watcher: asyncio.Task[None] | None = None
    publisher: asyncio.Task[None] | None = None
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    # Its last socket left (`LiveRegistry.leave`): announcements start no round any more.
    stopped: bool = False

    def tasks(self) -> list[asyncio.Task[None]]:
        return [t for t in (self.listener, self.refresher, self.watcher, self.publisher) if t is not None]

    def wanted(self) -> dict[str, int]:
        """Subscribed players -> the widest radius asked for them in this process."""
        out: dict[str, int] = {}
        for socket in self.sockets.values():
            player_id = socket.subscription.player_id
            if player_id is not None:
                out[player_id] = max(out.get(player_id, 0), socket.subscription.radius)
        return out

    def announce(self, event: Mapping[str, Any]) -> None:
        """A version was published: publish it to this process's sockets. Never waits; an
        announcement that comes while an older round is being sent is coalesced with any
        others into one round of the newest."""
        if self.stopped:
            return
        self.stats.announcements += 1
        self.heard_at = asyncio.get_running_loop().time()
        if event.get("state") is not None:
            self.state, self.final_version = event["state"], event.get("final_version")
        version = int(event["version"])
        if version <= self.latest:
            return
        self.latest = version
        if self.publisher is None or self.publisher.done():
            self.publisher = asyncio.ensure_future(self._publish_newest())

    async def _publish_newest(self) -> None:
        while self.published < self.latest:
            version = self.latest
            try:
                await self._publish(version)
            except Exception:
                log.exception("live: publishing version %s of %s failed", version, self.slug)
            self.published = max(self.published, version)

    async def manifest(self, version: int) -> Manifest | None:
        """A published manifest (immutable, version numbers are never reused): cached."""
        found = self.manifests.get(version)
        if found is None:
            async with asyncio.timeout(REDIS_READ_TIMEOUT_SECONDS):
                raw = await self.redis.get(self.keys.manifest(version))
            if raw is None:
                return None
            found = self.manifests[version] = Manifest.from_json(raw)
            for old in sorted(self.manifests)[:-MANIFESTS_KEPT]:
                del self.manifests[old]
        return found

    async def board(self, version: int) -> Manifest | None:
        """The version as this hub's board: the manifest, or its region's board (None too
        when the version has no board of the region: nothing of it can be shown)."""
        manifest = await self.manifest(version)
        if manifest is None or self.region is None:
            return manifest
        return manifest.board_of(self.region)

    async def _publish(self, version: int) -> None:
        """One round: the version's shared text once, then every socket without a player
        while the players are read in one batch, then every socket with one.

        With the cyclic garbage collector paused (`gc_paused`): a round allocates tens of
        thousands of short-lived objects (the players' replies and windows, a message and
        a frame per socket), and collections during it promoted them to the oldest
        generation, whose full collections (the whole heap of every connection) then came
        every few versions and were most of a worker's time in a fan-out. Paused, what
        dies in the round is freed by reference counting and never promoted.
        """
        with gc_paused():
            await self._round(version)

    async def _round(self, version: int) -> None:
        try:
            manifest = await self.board(version)
            previous = await self.board(version - 1) if manifest is not None and version > 1 else None
        except Exception:
            log.exception("live: round for version %s of %s failed", version, self.slug)
            return
        if manifest is None:
            await self.unavailable_publish()
            return
        self.stats.rounds += 1
        rnd = self.current = round_build(self.slug, self.state, self.final_version, manifest, previous)
        wanted = self.wanted()
        reading = asyncio.ensure_future(self._players_read(manifest, wanted)) if wanted else None
        if reading is not None:
            await asyncio.sleep(0)  # the read's first request goes out: Redis works while this process sends
        await self._fan_out(rnd, with_player=False)
        if reading is not None:
            rnd.players = await reading
            await self._fan_out(rnd, with_player=True)

    async def _players_read(self, manifest: Manifest, wanted: dict[str, int]) -> dict[str, PlayerRead] | None:
        try:
            players, trips = await players_read_async(self.redis, self.keys, manifest, wanted)
        except rankview.Torn:
            log.info("live: version %s of %s was superseded before its players were read", manifest.version,
                     self.slug)
            return None
        except Exception:
            log.exception("live: player reads for version %s of %s failed", manifest.version, self.slug)
            return None
        self.stats.players_read += len(wanted)
        self.stats.round_trips += trips
        return players

    async def _fan_out(self, rnd: Round, *, with_player: bool) -> None:
        # Sockets without a player that last sent the same version get the same text, and
        # the same frame (built when a socket first needs it).
        texts: dict[int | None, str] = {}
        frames: dict[tuple[int | None, FrameKind], bytes] = {}
        # Sockets with a player on deflate connections: the shared part compressed once.
        spliced: dict[Deflate, SplicedDeflate] = {}
        sockets = [s for s in self.sockets.values() if (s.subscription.player_id is not None) is with_player]
        for index, socket in enumerate(sockets):
            if index and index % FAN_OUT_SLICE == 0:
                await asyncio.sleep(0)  # let the loop breathe between slices of a large season
                if self.current is not rnd:
                    return  # views lost meanwhile; a newer round sends its own
            if socket.closed or (socket.sent_version is not None and socket.sent_version >= rnd.version):
                continue
            if socket.busy:
                self.stats.skipped_busy += 1
                continue
            if not with_player:
                text = texts.get(socket.sent_version)
                if text is None:
                    text, _ = version_text(version=rnd.version, full=rnd.full, diff=rnd.diff,
                                           sent_version=socket.sent_version, subscription=socket.subscription,
                                           mark=None)
                    texts[socket.sent_version] = text
                frame = None
                if socket.kind is not None:
                    frame = frames.get((socket.sent_version, socket.kind))
                    if frame is None:
                        frame = frames[socket.sent_version, socket.kind] = frame_build(text.encode(), socket.kind)
                self._send(socket, text, rnd.version, None, frame)
                continue
            if rnd.players is None:
                continue  # superseded before its players were read: the next version follows
            read = _read_for(rnd.players, socket.subscription)
            if read is None:
                # Subscribed after the batch was planned: its own read, in its own task.
                asyncio.ensure_future(self.catch_up(socket))
                continue
            text, mark = version_text(version=rnd.version, full=rnd.full, diff=rnd.diff,
                                      sent_version=socket.sent_version, subscription=socket.subscription,
                                      mark=socket.mark, entry=read.entry, window=read.window)
            frame = None
            if isinstance(socket.kind, Deflate):
                deflater = spliced.get(socket.kind)
                if deflater is None:
                    deflater = spliced[socket.kind] = SplicedDeflate(socket.kind, (rnd.diff, rnd.full))
                frame = deflater.frame(text)
            self._send(socket, text, rnd.version, mark, frame)

    def _send(self, socket: Socket, text: str, version: int | None, mark: PlayerMark | None,
              frame: bytes | None = None) -> None:
        """Send one socket its message from the fan-out; `version` None: an unavailable message.

        On a connection the hub can write to (`Socket.wire`) the frame goes to its
        transport at once (`frame`: the text's frame, shared by the sockets that send the
        same text): no ASGI message, coroutine, encoding or frame object per socket. When
        that connection's own send would not just write (its client is not reading, it is
        closing), the ASGI send below does what it does.
        """
        try:
            if socket.kind is not None and wire_write(socket.wire, frame or frame_build(text.encode(), socket.kind)):
                self.stats.direct += 1
                _sent(socket, text, version, mark)
                return
            rest = send_started(socket.send(socket.message(text)))
        except Exception:
            self._gone(socket)  # the client went away: its consumer hears of it too
            return
        if rest is None:
            _sent(socket, text, version, mark)
            return
        self.stats.slow += 1
        socket.hold()
        asyncio.ensure_future(self._send_rest(socket, rest, text, version, mark))

    async def _send_rest(self, socket: Socket, rest: _Rest, text: str, version: int | None,
                         mark: PlayerMark | None) -> None:
        if not await self._bounded(socket, rest):
            return
        _sent(socket, text, version, mark)
        socket.release()
        await self.catch_up(socket)

    async def _bounded(self, socket: Socket, sending: Awaitable[None]) -> bool:
        """Await a send to a held socket for at most the send timeout; False: the socket
        is done for (too slow, or gone)."""
        try:
            async with asyncio.timeout(send_timeout()):
                await sending
        except TimeoutError:
            self._slow(socket)
            return False
        except Exception:
            self._gone(socket)
            return False
        return True

    def _gone(self, socket: Socket) -> None:
        socket.closed = True
        socket.release()

    def _slow(self, socket: Socket) -> None:
        """A client that took no frame for the send timeout: its consumer closes it (4408)."""
        log.info("live: dropping a slow client of %s (no send progress in %.1fs)", self.slug, send_timeout())
        self.stats.dropped += 1
        socket.closed = True
        socket.release()
        socket.inbox.put_nowait({"type": "live.slow"})

    async def catch_up(self, socket: Socket) -> None:
        """Bring one socket to the newest round, after a send or snapshot of its own that
        the fan-out had to pass over (or a player the batch did not hold). Returns at
        once when someone else is sending to it: they call this when done."""
        while not socket.closed and not socket.busy:
            rnd = self.current
            if rnd is None or (socket.sent_version is not None and socket.sent_version >= rnd.version):
                return
            socket.hold()
            try:
                text, mark = await self._text_for(socket, rnd)
                if text is None or not await self._bounded(socket, socket.send(socket.message(text))):
                    return
                socket.sent(rnd.version, mark)
            finally:
                socket.release()

    async def _text_for(self, socket: Socket, rnd: Round) -> tuple[str | None, PlayerMark | None]:
        sub = socket.subscription
        if sub.player_id is None:
            return version_text(version=rnd.version, full=rnd.full, diff=rnd.diff,
                                sent_version=socket.sent_version, subscription=sub, mark=None)
        read = _read_for(rnd.players, sub) if rnd.players is not None else None
        if read is None:
            read = await self.player_one(rnd.manifest, sub.player_id, sub.radius)
        if read is None:
            return None, socket.mark  # superseded before it was read: the next version follows
        return version_text(version=rnd.version, full=rnd.full, diff=rnd.diff, sent_version=socket.sent_version,
                            subscription=sub, mark=socket.mark, entry=read.entry, window=read.window)

    async def player_one(self, manifest: Manifest, player_id: str, radius: int) -> PlayerRead | None:
        """One player in a round's version, for a socket the round's batch did not cover."""
        try:
            reads, _ = await players_read_async(self.redis, self.keys, manifest, {player_id: radius})
        except rankview.Torn:
            return None
        except Exception:
            log.exception("live: read of %s in version %s of %s failed", player_id, manifest.version, self.slug)
            return None
        return reads[player_id]

    # ------------------------------------------------------------------- views lost

    async def unavailable_publish(self) -> None:
        """No version can be served (the views were lost, or none was published yet): tell
        every socket that shows a board, or an older notice, with a running recovery's
        progress. Repeated by the watcher until a version is published again."""
        self.current = None
        text = await unavailable_text(self.slug, self.state, self.final_version, region=self.region)
        for socket in list(self.sockets.values()):
            if not socket.closed and not socket.busy and socket.unavailable != text:
                self._send(socket, text, None, None)

    async def check(self) -> None:
        """What the watcher does when no announcement came for a while: a version this
        process was not told of (a lost announcement) is published to its sockets; views
        found lost are said so, with the recovery's progress, while they stay lost."""
        try:
            async with asyncio.timeout(REDIS_READ_TIMEOUT_SECONDS):
                raw = await self.redis.get(self.keys.ptr)
            version = int(raw) if raw is not None else None
            manifest = await self.manifest(version) if version is not None else None
        except Exception:
            log.warning("live: pointer of %s could not be read", self.slug, exc_info=True)
            manifest = None
        if manifest is not None:
            if manifest.version > self.latest:
                self.announce({"version": manifest.version})
            return
        if any(s.sent_version is not None or s.unavailable is not None for s in self.sockets.values()):
            await self.unavailable_publish()


def _read_for(players: Mapping[str, PlayerRead], sub: Subscription) -> PlayerRead | None:
    assert sub.player_id is not None
    read = players.get(sub.player_id)
    return read if read is not None and read.radius >= sub.radius else None


def _sent(socket: Socket, text: str, version: int | None, mark: PlayerMark | None) -> None:
    if version is None:
        socket.sent_unavailable(text)
    else:
        socket.sent(version, mark)


async def _watch(hub: SeasonHub) -> None:
    """Checks the season's pointer every VIEWS_CHECK_SECONDS without an announcement.

    While views are lost no version is published, so nothing would tell a socket that
    the board it shows is gone, or how the recovery advances; and an announcement lost
    on the channel layer would leave sockets a version behind until the next one.
    """
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(VIEWS_CHECK_SECONDS)
        if loop.time() - hub.heard_at < VIEWS_CHECK_SECONDS:
            continue
        try:
            await hub.check()
        except Exception:
            log.exception("live: check of %s failed", hub.slug)


# ----------------------------------------------------------------------------- snapshots


@dataclass(frozen=True, slots=True)
class Snapshot:
    manifest: Manifest
    top: list[dict[str, Any]]
    player: PlayerRead | None


def snapshot_read(season_slug: str, subscription: Subscription) -> Snapshot | None:
    """The current version for one socket (on connect and on request); None: unavailable.

    Top and player come from the one manifest the reader chose: the top 100 lives in it.
    A regional subscription reads that region's board of the version; a version without
    it (the consumer checked the season has the region) has nothing to show either.
    """
    reader = leaderboard_reader(season_slug=season_slug, region=subscription.region)
    try:
        if subscription.player_id is None:
            manifest, top = reader.top(TOP_LIMIT)
            return Snapshot(manifest=manifest, top=top, player=None)
        manifest, me, window = reader.neighbors(subscription.player_id, subscription.radius)
        return Snapshot(manifest=manifest, top=manifest.top[:TOP_LIMIT],
                        player=PlayerRead(entry=me, window=tuple(window), radius=subscription.radius))
    except (rankview.Unavailable, rankview.UnknownRegion):
        return None


def snapshot_message(season_slug: str, state: str | None, final_version: int | None, snapshot: Snapshot,
                     subscription: Subscription) -> dict[str, Any]:
    manifest = snapshot.manifest
    message: dict[str, Any] = {
        "type": "snapshot", "season_id": season_slug, **board_fields(manifest.board), "state": state,
        "final_version": final_version,
        "leaderboard_version": manifest.version, "as_of": manifest.as_of, "total_players": manifest.total,
        "top": snapshot.top,
    }
    if subscription.player_id is not None and snapshot.player is not None:
        message["player"] = player_payload(subscription.player_id, snapshot.player.entry,
                                           snapshot.player.window, subscription.radius)
    return message


def unavailable_message(season_slug: str, state: str | None, final_version: int | None,
                        recovery: dict[str, Any] | None = None, *, region: str | None = None) -> dict[str, Any]:
    """The read API's 503 body as a socket message: the same reason and retry_after, and
    the progress of the season's recovery while one runs (`recovery_payload`), else null."""
    refusal = read_unavailable()
    return {
        "type": refusal.code, "season_id": season_slug, **board_fields(region or ""), "state": state,
        "final_version": final_version,
        "retry_after": refusal.retry_after,
        "detail": f"{refusal.detail}; the next published version is pushed to this socket",
        "recovery": recovery,
    }


def recovery_progress(season_slug: str) -> dict[str, Any] | None:
    """The progress of the season's running recovery (a RebuildJob of kind recovery that
    is queued, building or comparing), as the console shows it; None when none runs."""
    row = (
        RebuildJob.objects
        .filter(season__slug=season_slug, kind=RebuildJob.Kind.RECOVERY, status__in=ACTIVE_REBUILD_STATUSES)
        .values_list("status", "done", "total", "eta_seconds")
        .first()
    )
    if row is None:
        return None
    status, done, total, eta_seconds = row
    return recovery_payload(status=status, done=done, total=total, eta_seconds=eta_seconds)


async def unavailable_text(season_slug: str, state: str | None, final_version: int | None, *,
                           region: str | None = None) -> str:
    """The unavailable message, serialized, with the running recovery's progress (null
    when none runs, or when the database cannot say: the notice matters more)."""
    try:
        progress = await database_sync_to_async(recovery_progress)(season_slug)
    except Exception:
        log.warning("live: recovery progress of %s could not be read", season_slug, exc_info=True)
        progress = None
    return orjson.dumps(unavailable_message(season_slug, state, final_version, progress, region=region)).decode()


# ------------------------------------------------------------------------------ listener


async def _listen(hub: SeasonHub) -> None:
    """The process's member of the season's group: receive announcements, hand them to the hub.

    A Redis error does not end it: it waits (backing off), re-joins and goes on. A second
    task re-joins every `group_refresh_seconds`, since a group Redis lost or expired would
    otherwise stay silent. The receive itself is cancelled only when the hub stops (its
    last socket left, or the loop is closing: `tasks_stop`): a receive cancelled as its
    message arrives could lose it.
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
                    refresher = hub.refresher = asyncio.ensure_future(_rejoin_periodically(layer, group, channel))
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
        with contextlib.suppress(Exception):
            async with asyncio.timeout(GROUP_DISCARD_TIMEOUT_SECONDS):
                if refresher is not None:
                    # Ended before the discard, so no re-join lands after it.
                    rejoining = refresher
                    await tasks_stop(lambda: [rejoining], retry_seconds=GROUP_DISCARD_TIMEOUT_SECONDS / 4)
                await layer.group_discard(group, channel)


async def tasks_stop(tasks: Callable[[], list[asyncio.Task[None]]], *,
                     retry_seconds: float = TASK_STOP_RETRY_SECONDS) -> None:
    """Cancel the tasks `tasks()` names and return once every one has ended, cancelling
    again those still running after `retry_seconds` (and any `tasks()` names by then).
    Cancelled itself, it cancels what is still running once more before it ends.

    One cancellation is not always enough: on Python 3.11, redis-py sends each command
    through `asyncio.wait_for` when the client has a socket timeout (the channel layer's
    has), and a cancellation that lands as that send completes is lost there. A listener
    that lost its cancellation would otherwise poll the channel layer for ever, and the
    event loop could never close.
    """
    cancelled: set[asyncio.Task[None]] = set()
    try:
        while True:
            pending = {task for task in tasks() if not task.done()}
            if not pending:
                return
            # Once each: a second cancellation would cut short a task's way out (the
            # listener's group_discard), so it comes only after `retry_seconds`.
            for task in pending - cancelled:
                task.cancel()
                cancelled.add(task)
            _, still = await asyncio.wait(pending, timeout=retry_seconds)
            if still:
                log.info("live: %d task(s) still running %.1fs after a cancellation; cancelling again",
                         len(still), retry_seconds)
                for task in still:
                    task.cancel()
    except asyncio.CancelledError:
        # Only the tasks not cancelled yet: the loop is closing, and cancels the rest itself.
        for task in tasks():
            if not task.done() and task not in cancelled:
                task.cancel()
        raise


async def _rejoin_periodically(layer: Any, group: str, channel: str) -> None:
    while True:
        await asyncio.sleep(group_refresh_seconds())
        try:
            await layer.group_add(group, channel)
        except Exception:
            log.warning("live: could not re-join %s", group, exc_info=True)


def hub_key(season_slug: str, region: str | None) -> str:
    """A board's hub in the registry: the season's slug for the global board, slug/region
    for a region's ("/" is in neither)."""
    return season_slug if region is None else f"{season_slug}/{region}"


class LiveRegistry:
    """Per-process (per event loop) registry of live sockets, by board (`hub_key`)."""

    def __init__(self) -> None:
        self.hubs: dict[str, SeasonHub] = {}
        self._redis: redis.asyncio.Redis | None = None
        # Hubs whose last socket left, while their tasks are being stopped (`tasks_stop`).
        self._stopping: set[asyncio.Task[None]] = set()

    def redis(self) -> redis.asyncio.Redis:
        """The process's asyncio Redis client for rounds. A blocking pool: a burst of reads
        waits for a connection instead of failing (redis-py's default pool raises). No
        socket_timeout: redis-py would wrap every reply of a pipeline in a timer of its
        own; its callers bound each read as a whole (REDIS_READ_TIMEOUT_SECONDS)."""
        if self._redis is None and settings.REDIS_CLUSTER:
            # Per node: a pool of up to ASYNC_REDIS_CONNECTIONS each (pipeline_raw).
            self._redis = cast(redis.asyncio.Redis, redis.asyncio.RedisCluster.from_url(
                settings.REDIS_URL, max_connections=ASYNC_REDIS_CONNECTIONS, socket_timeout=None,
                socket_connect_timeout=2.0))
        if self._redis is None:
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                settings.REDIS_URL, max_connections=ASYNC_REDIS_CONNECTIONS, timeout=10,
                socket_timeout=None, socket_connect_timeout=2.0)
            self._redis = redis.asyncio.Redis(connection_pool=pool)
        return self._redis

    async def join(self, season_slug: str, socket_id: str, socket: Socket,
                   socket_state: tuple[str | None, int | None] = (None, None)) -> SeasonHub:
        """Register a socket (busy: its consumer sends its snapshot, then calls `catch_up`);
        returns once the process is in the season's group, so a version published after
        this returns reaches the socket. `socket_state`: the season's (state,
        final_version) as the consumer read it, for a new hub. Raises TimeoutError when the
        group cannot be joined within JOIN_TIMEOUT_SECONDS (Redis down); the socket is then
        not registered. The socket's hub is its board's (`Subscription.region`)."""
        region = socket.subscription.region
        hub = self.hubs.get(hub_key(season_slug, region))
        if hub is None:
            hub = self.hubs[hub_key(season_slug, region)] = SeasonHub(
                slug=season_slug, redis=self.redis(), keys=rankview.Keys(settings.REDIS_KEY_PREFIX, season_slug),
                region=region)
        hub.sockets[socket_id] = socket
        if hub.state is None:
            hub.state, hub.final_version = socket_state
        if hub.listener is None or hub.listener.done():
            hub.listener = asyncio.ensure_future(_listen(hub))
        if hub.watcher is None or hub.watcher.done():
            hub.watcher = asyncio.ensure_future(_watch(hub))
        try:
            async with asyncio.timeout(JOIN_TIMEOUT_SECONDS):
                await hub.joined.wait()
        except TimeoutError:
            self.leave(season_slug, socket_id, region=region)
            raise
        return hub

    def leave(self, season_slug: str, socket_id: str, *, region: str | None = None) -> None:
        hub = self.hubs.get(hub_key(season_slug, region))
        if hub is None:
            return
        socket = hub.sockets.pop(socket_id, None)
        if socket is not None:
            socket.closed = True
        if not hub.sockets:
            del self.hubs[hub_key(season_slug, region)]
            self._stop(hub)

    def _stop(self, hub: SeasonHub) -> None:
        """Stop the hub: no round starts from now on, and its tasks are cancelled and seen
        to end (`tasks_stop`, in a task of its own)."""
        hub.stopped = True
        if all(task.done() for task in hub.tasks()):
            return
        stopper = asyncio.ensure_future(tasks_stop(hub.tasks))
        self._stopping.add(stopper)
        stopper.add_done_callback(self._stopping.discard)

    async def aclose(self) -> None:
        """Stop every hub of this event loop and return once their listeners, group
        refreshers, watchers and publishers have ended: for a loop about to close (a
        worker's at shutdown, `live.routing.lifespan`, and the tests'), so that no
        listener outlives it (a round's own short tasks, a player read or a send to a
        slow client, end within their timeouts). A listener leaves its group on its way
        out, within GROUP_DISCARD_TIMEOUT_SECONDS; the group forgets it after its expiry
        otherwise. Cancelling this leaves the stoppers running."""
        for key in list(self.hubs):
            hub = self.hubs.pop(key)
            for socket in hub.sockets.values():
                socket.closed = True
            self._stop(hub)
        while self._stopping:
            await asyncio.wait(set(self._stopping))


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveRegistry] = weakref.WeakKeyDictionary()


def registry() -> LiveRegistry:
    """The registry of the running event loop: rounds and listeners are tasks of that loop."""
    loop = asyncio.get_running_loop()
    found = _registries.get(loop)
    if found is None:
        found = _registries[loop] = LiveRegistry()
    return found
