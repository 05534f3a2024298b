"""The live board socket, /ws/v1/seasons/{season_id}/live[?player_id=P&radius=R&region=G]
(docs/api.md, Live board websocket).

Thin: what to send is decided in leaderboard.core.live (pure), leaderboard.live.hub (rounds,
the per-process registry, group listener and fan-out) and leaderboard.live.messages
(snapshots, "unavailable"). This class admits the socket, registers it with its board's
hub (the season's, or a region's; live.Socket holds what the socket last sent, the base of
diffs and events), sends its snapshots, answers the client, and closes it when the hub
finds its client too slow.

The socket itself is not a member of the channel layer's group (its process is, once per
season), so it has no channel of its own, and versions are sent to it by the hub: its
dispatch loop reads the client and an inbox of the hub's rare control messages.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import orjson
from asgiref.sync import sync_to_async
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.utils import await_many_dispatch

from leaderboard.core.events import id_is_valid
from leaderboard.core.live import (
    CLOSE_SLOW_CONSUMER,
    CLOSE_TOO_MANY_SNAPSHOTS,
    CLOSE_UNKNOWN_SEASON,
    PlayerMark,
    Refusal,
    SnapshotBudget,
    client_message_parse,
    region_refusal,
    subscription_parse,
)
from leaderboard.live import hub as live
from leaderboard.live.announce import season_live_state
from leaderboard.live.messages import snapshot_read, snapshot_text, unavailable_message, unavailable_text
from leaderboard.ratelimit import live_sockets, scope_address
from seasons.selectors import season_get

log = logging.getLogger(__name__)

CLOSE_WAIT_SECONDS = 1.0
# RFC 6455 "try again later": the server could not join the season's group (Redis down).
CLOSE_TRY_AGAIN_LATER = 1013
# Refused at the handshake: this process holds its limit of sockets (per address or in all).
CLOSE_TOO_MANY_SOCKETS = 4429


class LiveBoardConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slug = ""
        # The region whose board the socket follows (None: the global board).
        self.region: str | None = None
        self.socket: live.Socket | None = None
        self.hub: live.SeasonHub | None = None
        self.socket_id = uuid.uuid4().hex
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=live.INBOX_SIZE)
        self.state: str | None = None
        self.final_version: int | None = None
        self.budget = SnapshotBudget()
        self.closing = False
        # The address this socket counts against (ratelimit.live_sockets), once admitted.
        self.counted_address: str | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # Channels' AsyncConsumer.__call__, without a channel-layer channel per socket: the
        # second source of messages is the socket's inbox, fed by its season's hub.
        # However the socket ends (disconnect, a send to a vanished client raising, a
        # dropped slow client), it leaves the registry.
        self.scope = scope
        self.channel_layer = None
        self.channel_name = self.socket_id
        self.base_send = send
        try:
            await await_many_dispatch([receive, self.inbox.get], self.dispatch)
        except StopConsumer:
            pass
        finally:
            self._leave()
            if self.counted_address is not None:
                live_sockets.leave(self.counted_address)
                self.counted_address = None

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' dispatch closes stale database connections before every message, a
        # hop through the one shared sync thread: per socket per version that queues
        # thousands of hops behind each other. This consumer touches the database only
        # through database_sync_to_async, which does that cleanup itself.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        return orjson.dumps(content).decode()

    # -------------------------------------------------------------------- connect / close

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        self.slug = self.scope["url_route"]["kwargs"]["season_id"]
        # Accept first: a refusal is a JSON error and a close code the client can read,
        # not a bare HTTP 403 from the handshake.
        await self.accept()
        address = scope_address(self.scope)
        if not live_sockets.enter(address):
            await self._refuse(Refusal(CLOSE_TOO_MANY_SOCKETS, "rate_limited",
                                       "too many live sockets from this address or on this server; retry later"))
            return
        self.counted_address = address
        parsed = subscription_parse(self.scope.get("query_string", b""))
        if isinstance(parsed, Refusal):
            await self._refuse(parsed)
            return
        # An id outside the id rule names no season (and never reaches the database).
        found = await database_sync_to_async(season_live_state)(self.slug) if id_is_valid(self.slug) else None
        if found is None:
            await self._refuse(Refusal(CLOSE_UNKNOWN_SEASON, "unknown_season", f"no season {self.slug!r}"))
            return
        if parsed.region is not None:
            # A season's regions are fixed once it opens: the handshake's answer holds.
            season = await database_sync_to_async(season_get)(slug=self.slug)
            refusal = region_refusal(parsed.region, season.regions if season is not None else [])
            if refusal is not None:
                await self._refuse(refusal)
                return
            self.region = parsed.region
        self.state, self.final_version = found
        # Registered busy: the hub sends this socket nothing until its snapshot is sent; a
        # version published in between is sent by catch_up after it (or skipped if the
        # snapshot has it already).
        self.socket = live.Socket(parsed, self.base_send, self.inbox)
        try:
            self.hub = await live.registry().join(self.slug, self.socket_id, self.socket, found)
        except TimeoutError:
            await self._send_message(unavailable_message(self.slug, self.state, self.final_version,
                                                         region=self.region))
            self.closing = True
            await self.close(code=CLOSE_TRY_AGAIN_LATER, reason="try_again_later")
            return
        await self._snapshot(held=True)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        self._leave()
        raise StopConsumer()

    def _leave(self) -> None:
        # By socket, not by self.hub: a socket that went away while joining is registered
        # already. Leaving twice is harmless.
        if self.socket is not None:
            live.registry().leave(self.slug, self.socket_id, region=self.region)
            self.hub = None

    async def _refuse(self, refusal: Refusal) -> None:
        self.closing = True
        await self._send_message(refusal.message())
        await self.close(code=refusal.code, reason=refusal.error)

    # ----------------------------------------------------------------------------- sending

    async def _send_message(self, message: dict[str, Any]) -> bool:
        return await self._send_text(orjson.dumps(message).decode())

    async def _send_text(self, text: str) -> bool:
        """Send one frame, or drop the socket if the client does not take it in time.

        The server's websocket send waits while the connection's write buffer is full (the
        client is not reading). The socket is held meanwhile (its snapshot), so the hub
        passes it over and one stuck client delays only itself; the timeout bounds even
        that, and frees what it holds.
        """
        try:
            async with asyncio.timeout(live.send_timeout()):
                await self.send(text_data=text)
            return True
        except TimeoutError:
            pass
        log.info("live: dropping a slow client of %s (no send progress in %.1fs)", self.slug, live.send_timeout())
        await self._close_slow()
        return False  # not reached: _close_slow ends the consumer

    async def _close_slow(self) -> None:
        self.closing = True
        self._leave()
        try:
            async with asyncio.timeout(CLOSE_WAIT_SECONDS):
                await self.close(code=CLOSE_SLOW_CONSUMER, reason="slow_consumer")
        except TimeoutError:
            pass  # its buffer is still full: the server closes the transport when we return
        raise StopConsumer()

    async def _snapshot(self, *, held: bool = False) -> None:
        """Send the current version whole (or "unavailable"), then whatever the hub
        published meanwhile. `held`: the socket is held already (its first snapshot)."""
        socket, hub = self.socket, self.hub
        assert socket is not None
        if not held:
            await socket.take()
        try:
            try:
                snap = await sync_to_async(snapshot_read, thread_sensitive=False)(self.slug,
                                                                                  socket.subscription)
            except Exception:
                # Redis unreachable: say "unavailable" (the next version is pushed when there
                # is one) rather than end the socket with a server error.
                log.exception("live: snapshot of %s failed", self.slug)
                snap = None
            if snap is None:
                text = await unavailable_text(self.slug, self.state, self.final_version, region=self.region)
                if await self._send_text(text):
                    socket.sent_unavailable(text)
            else:
                text = snapshot_text(self.slug, self.state, self.final_version, snap, socket.subscription)
                if await self._send_text(text):
                    socket.sent(snap.manifest.version,
                                PlayerMark.of(snap.player.entry) if snap.player is not None else None)
        finally:
            socket.release()
        if hub is not None and not self.closing:
            await hub.catch_up(socket)

    # ------------------------------------------------------------------ hub: slow client

    async def live_slow(self, message: dict[str, Any]) -> None:
        """The hub could not hand this socket a frame within the send timeout."""
        await self._close_slow()

    # --------------------------------------------------------------------- client messages

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if self.closing:
            return
        refusal = client_message_parse(text_data, bytes_data)
        if refusal is not None:
            await self._refuse(refusal)
            return
        if not self.budget.take(time.monotonic()):
            await self._refuse(Refusal(CLOSE_TOO_MANY_SNAPSHOTS, "too_many_snapshots",
                                       "snapshot requests are limited to a burst of 5, then one per 2 s"))
            return
        if self.socket is None:
            return
        # The state may have moved (to FINAL) without a new version: read it afresh.
        found = await database_sync_to_async(season_live_state)(self.slug)
        if found is not None:
            self.state, self.final_version = found
        await self._snapshot()
