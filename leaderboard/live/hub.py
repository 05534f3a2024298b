"""Live boards over websockets (docs/architecture.md, Live boards): the per-process fan-out.

One published version reaches the sockets like this:

1. The epoch swaps the pointer to version V, records it, and (on commit) calls
   `live_version_published` (live.announce): ONE `channel_layer.group_send` to the
   season's group `live.{season}` carrying only {version, state}.
2. The members of that group are server processes, not sockets: each process that has
   sockets of the season runs one listener (`_listen`) with one channel in the group, so
   the announcement is one small Redis message per process, handed to the process's
   `SeasonHub` of the season.
3. The hub runs one *round* per version (`SeasonHub._publish`), read with the process's
   asyncio Redis client in the event loop (a worker thread would fight the loop for the
   GIL while it sends): the manifests of V and V-1 (cached), the part of the message
   every socket shares serialized twice (full top 100, and the diff against V-1); then
   rank and neighbours of every player subscribed in this process in at most four
   pipelined round trips (`players_plan`, live.players, over live.redis_async's raw
   pipelines), whatever their number. Announcements that come while a round is being
   sent are coalesced into one round of the newest.
4. The hub sends each socket its message itself, in one pass over the sockets
   (`_fan_out`): sockets without a player first (while the players are read), each
   group of them that last sent the same version with one shared text; then each socket
   with a player, its own few fields spliced onto the shared text. A send is run in the
   hub's task until it completes, which the server's send does at once unless the
   client stopped reading (`send_started`; it and the frames the hub writes to a
   connection itself are live.frames), so the fan-out costs no task, future or timer
   per socket. A send that has to wait goes on in a task of its own bounded by
   the send timeout: a slow client is dropped (close 4408) instead of holding anything
   others wait for, and one that catches up gets the newest version (`catch_up`).
5. A watcher checks the season's pointer when no announcement came for a few seconds:
   views found lost (a flushed Redis) are said to every socket ("unavailable", with the
   running recovery's progress, repeated as it advances: live.messages), and a version
   whose announcement was lost is published to the sockets all the same.

Per process means per event loop: a uvicorn worker has one; tests create one per test.
A region's board (a socket's `?region=`) has a hub of its own beside the global board's,
with its own listener in the same group: each reads the announced version's manifest and
serves its board of it (`Manifest.board_of`), so the global hub's rounds are unchanged.

This module holds the sockets, the season hubs, their rounds, listener and watcher, and
the registry; what they use that knows nothing of sockets or hubs is in the modules named
above.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
import redis.asyncio
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections

from leaderboard.core.gc_pause import gc_paused
from leaderboard.core.live import TOP_LIMIT, PlayerMark, Subscription, board_fields, top_diff, version_text
from leaderboard.core.manifest import Manifest
from leaderboard.history.selectors import movements_fill
from leaderboard.live.announce import season_group
from leaderboard.live.frames import (
    Deflate,
    FrameKind,
    SplicedDeflate,
    frame_build,
    frame_kind,
    send_started,
    wire_of,
    wire_write,
)
from leaderboard.live.messages import unavailable_text
from leaderboard.live.players import PlayerRead, player_shown, players_read_async
from leaderboard.live.redis_async import REDIS_READ_TIMEOUT_SECONDS, loop_redis, pipeline_raw
from leaderboard.views import rankview
from leaderboard.views.names import names_call, top_ids, top_shown
from leaderboard.views.season_index import season_keys

log = logging.getLogger(__name__)

# Manifests a process keeps per season: the current version's and the one before (its
# diff base), and a few more for a socket that is a version or two behind.
MANIFESTS_KEPT = 4
# Control messages a socket's consumer may have waiting (only live.slow today).
INBOX_SIZE = 8
JOIN_TIMEOUT_SECONDS = 10.0
# Sockets sent to between two yields to the event loop: a fan-out to 10,000 sockets
# must not hold the loop (handshakes, client messages, the listener) for its whole length.
FAN_OUT_SLICE = 512
# channels-redis's receive: one BZPOPMIN of this long.
LAYER_POLL_SECONDS = 5.0
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
                previous: Manifest | None, names: Sequence[Sequence[bytes | None]] = ((), ())) -> Round:
    """The shared half of a round: the version's fields and top, serialized once per process.
    `names`: the names of the version's top and of the previous one's (names_call of each
    top_ids), read with the round; names change between versions like scores do."""
    base: dict[str, Any] = {
        "type": "version", "season_id": season_slug, **board_fields(manifest.board), "state": state,
        "final_version": final_version, "leaderboard_version": manifest.version, "as_of": manifest.as_of,
        "total_players": manifest.total,
    }
    top = top_shown(manifest, names[0])[:TOP_LIMIT]
    full = orjson.dumps({**base, "top": top}).decode()
    diff = None
    if previous is not None:
        change = top_diff(top_shown(previous, names[1])[:TOP_LIMIT], top)
        diff = orjson.dumps({**base, "top_diff": {"base_version": previous.version, **change}}).decode()
    return Round(version=manifest.version, manifest=manifest, full=full, diff=diff)


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
    # The followers' rank_24h_ago being computed in a worker thread (`_movements_fill`).
    filling: asyncio.Future[int] | None = None

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

    def announce(self, event: Mapping[str, Any], *, heard: bool = True) -> None:
        """A version was published: publish it to this process's sockets. Never waits; an
        announcement that comes while an older round is being sent is coalesced with any
        others into one round of the newest. `heard`: it came through the channel layer
        (not from the watcher's own check, which must go on checking while none come)."""
        if self.stopped:
            return
        self.stats.announcements += 1
        if heard:
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
        try:
            names = await self._top_names(manifest, previous)
        except Exception:
            log.exception("live: names for version %s of %s failed", version, self.slug)
            return
        self.stats.rounds += 1
        rnd = self.current = round_build(self.slug, self.state, self.final_version, manifest, previous, names)
        wanted = self.wanted()
        reading = asyncio.ensure_future(self._players_read(manifest, wanted)) if wanted else None
        if reading is not None:
            await asyncio.sleep(0)  # the read's first request goes out: Redis works while this process sends
        await self._fan_out(rnd, with_player=False)
        if reading is not None:
            rnd.players = await reading
            await self._fan_out(rnd, with_player=True)

    async def _top_names(self, manifest: Manifest, previous: Manifest | None) -> list[list[bytes | None]]:
        """The names of the version's top and of the previous version's, in one round trip."""
        tops = [top_ids(manifest), top_ids(previous) if previous is not None else []]
        calls = [names_call(self.keys.prefix, ids) for ids in tops if ids]
        async with asyncio.timeout(REDIS_READ_TIMEOUT_SECONDS):
            replies = iter(await pipeline_raw(self.redis, calls)) if calls else iter(())
        return [next(replies) if ids else [] for ids in tops]

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
        self._movements_fill([p for p, read in players.items() if read.movement_missing])
        return players

    def _movements_fill(self, missing: list[str]) -> None:
        """Followers whose rank_24h_ago is not kept yet (a new hourly snapshot started the
        kept ranks over): computed from the database in a worker thread, one batch at a
        time, so the next rounds find them; this round shows none."""
        if not missing or (self.filling is not None and not self.filling.done()):
            return
        keys = self.keys

        def fill() -> int:
            from leaderboard.redis_client import redis_get

            try:
                return movements_fill(redis_get(), keys=keys, player_ids=missing[:MOVEMENTS_FILL_MAX])
            finally:
                close_old_connections()

        self.filling = asyncio.get_running_loop().run_in_executor(None, fill)
        self.filling.add_done_callback(_fill_logged)

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
                                      mark=socket.mark, entry=read.entry, window=read.window,
                                      **player_shown(rnd.manifest, read))
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

    async def _send_rest(self, socket: Socket, rest: Awaitable[None], text: str, version: int | None,
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
                            subscription=sub, mark=socket.mark, entry=read.entry, window=read.window,
                            **player_shown(rnd.manifest, read))

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
                self.announce({"version": manifest.version}, heard=False)
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
        # VIEWS_CHECK_SECONDS after the last announcement, not up to twice that.
        await asyncio.sleep(max(hub.heard_at + VIEWS_CHECK_SECONDS - loop.time(), 0.0) or VIEWS_CHECK_SECONDS)
        if loop.time() - hub.heard_at < VIEWS_CHECK_SECONDS:
            continue
        try:
            await hub.check()
        except Exception:
            log.exception("live: check of %s failed", hub.slug)


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
    loop = asyncio.get_running_loop()
    polled = loop.time()
    try:
        while True:
            try:
                await layer.group_add(group, channel)
                hub.joined.set()
                if refresher is None:
                    refresher = hub.refresher = asyncio.ensure_future(_rejoin_periodically(layer, group, channel))
                while True:
                    polled = loop.time()
                    hub.announce(await layer.receive(channel))
                    backoff = 0.1
            except asyncio.CancelledError:
                raise
            except redis.exceptions.TimeoutError:
                if loop.time() - polled > LAYER_POLL_SECONDS + 1:
                    # A Redis that hangs: the watcher reads the pointer meanwhile.
                    log.warning("live: the channel layer's Redis did not answer for %.0f s; the boards of %s "
                                "follow the season's pointer until it does", loop.time() - polled, hub.slug)
                elif not warned_timeout:
                    # channels-redis polls with BZPOPMIN for 5 s; a Redis client that times
                    # reads out after 5 s too (redis-py 8's default) fails every idle poll.
                    # Harmless here (the loop goes on), but a configuration error: say so once.
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
        """The loop's asyncio Redis client for rounds (live.redis_async.loop_redis)."""
        if self._redis is None:
            self._redis = loop_redis()
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
                slug=season_slug, redis=self.redis(), keys=season_keys(season_slug),
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


# Followers' rank_24h_ago computed per batch (about 1.5 ms of database each).
MOVEMENTS_FILL_MAX = 500


def _fill_logged(done: asyncio.Future[int]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("live: rank_24h_ago of followers not computed: %s", done.exception())
