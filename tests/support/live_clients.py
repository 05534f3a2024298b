"""Many websocket clients of one live board (docs/api.md, Live board websocket) in one
event loop of a thread of its own, each keeping what it was sent, for a test to check
against the ledger afterwards.

Each client follows the documented client rule: it ignores a `version` not above the one
it holds, applies a `top_diff` only to exactly its base version, and when a message's
`previous_version` or base is not the version it holds it asks for a `snapshot` (a gap,
recorded). An `unavailable` notice hides its board until a whole one comes. Every
message is kept (`Received`) with the board the client shows after it (the top 100 and
the player count; the top stored once per distinct board, `LiveClients.tops`), and
checked afterwards by `deliveries_check`: every board is the ledger's at its version,
versions only grow, every version published reached every client or a later message
told it that it had missed it, and no message left the client to find a gap itself.

The sockets are the `websockets` library's sans-I/O protocol driven by an asyncio.Protocol
(as bench/websockets.py's clients): a frame is parsed in the callback that reads it, with
no task per socket and message, so a thousand of them cost the two shared cores little."""

from __future__ import annotations

import asyncio
import resource
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.typing import Origin
from websockets.uri import parse_uri

from leaderboard.core.ranking import Standings
from tests.support.reference import answer_entry

SNAPSHOT_REQUEST = b'{"type": "snapshot"}'


def fd_limit_raise(wanted: int) -> int:
    """The soft limit of open files raised to `wanted` (at most the hard limit): a client
    socket each here, and as many in the server this process starts (it inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass(frozen=True, slots=True)
class Received:
    at: float  # time.monotonic() when it was read
    kind: str  # the message's type
    version: int | None  # its leaderboard_version
    previous: int | None  # a version message's previous_version
    full: bool  # it carried the whole top (a snapshot, or a version with `top`)
    held: int | None  # the version the client held before it
    gap: bool  # it did not follow from what the client held: the client asked for a snapshot
    ignored: bool  # a version not above the one the client held (the client rule ignores it)
    board: int | None  # the board the client shows after it (LiveClients.tops), None: none
    total: int | None
    player: dict[str, Any] | None


@dataclass(eq=False)
class LiveClient(asyncio.Protocol):
    """One socket and what it was sent."""

    owner: LiveClients
    url: str
    player_id: str | None
    opened: asyncio.Future[None]
    received: list[Received] = field(default_factory=list)
    held: int | None = None
    top: list[dict[str, Any]] | None = None
    closed: str | None = None
    asked: bool = False  # a snapshot was asked for and has not come yet
    transport: asyncio.Transport | None = None
    conn: ClientProtocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.conn = ClientProtocol(parse_uri(self.url), origin=Origin(self.owner.origin), max_size=2**22)
        self.conn.send_request(self.conn.connect())
        self._flush()

    def data_received(self, data: bytes) -> None:
        assert self.conn is not None
        now = time.monotonic()
        self.conn.receive_data(data)
        for event in self.conn.events_received():
            if isinstance(event, Response):
                if self.conn.handshake_exc is not None and not self.opened.done():
                    self.opened.set_exception(self.conn.handshake_exc)
            elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                self._message(orjson.loads(event.data), now)
            elif isinstance(event, Frame) and event.opcode is Opcode.CLOSE and not self.owner.stopping:
                self.closed = f"closed by the server: {bytes(event.data)[:2].hex()} {bytes(event.data)[2:]!r}"
        self._flush()

    def _message(self, message: dict[str, Any], now: float) -> None:
        kind = message.get("type", "?")
        version = message.get("leaderboard_version")
        previous = message.get("previous_version")
        gap = ignored = full = False
        held = self.held
        if kind in ("unavailable", "error"):
            self.held, self.top = None, None
        elif kind == "snapshot" or (kind == "version" and "top" in message):
            full = True
            version = int(message["leaderboard_version"])
            if self.held is not None and version < self.held:
                ignored = True
            else:
                gap = kind == "version" and previous != self.held
                self.held, self.top = version, list(message["top"])
                self.asked = self.asked and kind != "snapshot"
        elif kind == "version":
            diff = message["top_diff"]
            version = int(message["leaderboard_version"])
            if self.held is not None and version <= self.held:
                ignored = True
            elif self.top is None or previous != self.held or diff["base_version"] != self.held:
                gap = True
                self.held, self.top = version, None
                if not self.asked:  # one request at a time: the snapshot answers them all
                    self.asked = True
                    assert self.conn is not None
                    self.conn.send_text(SNAPSHOT_REQUEST)
            else:
                self.held, self.top = version, _top_apply(self.top, diff)
        self.received.append(Received(
            at=now, kind=kind, version=version, previous=previous, full=full, held=held, gap=gap, ignored=ignored,
            board=self.owner.board_id(self.top) if self.top is not None else None,
            total=message.get("total_players"), player=message.get("player")))
        if not self.opened.done():
            self.opened.set_result(None)

    def _flush(self) -> None:
        assert self.transport is not None and self.conn is not None
        for data in self.conn.data_to_send():
            if data:
                self.transport.write(data)
            else:
                self.transport.write_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc or ConnectionError("closed during the handshake"))
        elif not self.owner.stopping and self.closed is None:
            self.closed = f"connection lost: {exc!r}"


def _top_apply(old: list[dict[str, Any]], diff: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The new top from the old one and its diff (docs/api.md: `length`, and `set`, the entries
    whose position changed); None when the diff leaves a position empty."""
    length = int(diff["length"])
    new: list[dict[str, Any] | None] = [*old[:length], *([None] * (length - len(old)))]
    for entry in diff["set"]:
        new[int(entry["position"]) - 1] = entry
    return None if any(entry is None for entry in new) else cast(list[dict[str, Any]], new)


class LiveClients:
    """`count` clients of `url` (ws://.../ws/v1/seasons/{slug}/live), the first ones
    subscribed to `players` (`?player_id=P&radius=R`)."""

    def __init__(self, url: str, count: int, *, origin: str, players: Iterable[str] = (), radius: int = 2,
                 connecting: int = 64):
        self.url = url
        self.count = count
        self.origin = origin
        self.players = list(players)
        self.radius = radius
        self.connecting = connecting
        self.clients: list[LiveClient] = []
        self.failed: list[str] = []
        self.stopping = False
        # Every distinct board a client showed, once: its JSON, and its index.
        self.tops: list[bytes] = []
        self._top_ids: dict[bytes, int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="live-clients", daemon=True)

    def board_id(self, top: list[dict[str, Any]]) -> int:
        text = orjson.dumps(top)
        found = self._top_ids.get(text)
        if found is None:
            found = self._top_ids[text] = len(self.tops)
            self.tops.append(text)
        return found

    def start(self, *, timeout: float = 120) -> float:
        """Open every socket and wait for its first message; the seconds it took."""
        started = time.monotonic()
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open_all(), self._loop).result(timeout=timeout)
        return time.monotonic() - started

    async def _open_all(self) -> None:
        gate = asyncio.Semaphore(self.connecting)
        uri = parse_uri(self.url)

        async def one(index: int) -> None:
            player = self.players[index] if index < len(self.players) else None
            url = self.url + (f"?player_id={player}&radius={self.radius}" if player else "")
            async with gate:
                opened: asyncio.Future[None] = self._loop.create_future()
                client = LiveClient(owner=self, url=url, player_id=player, opened=opened)
                try:
                    await asyncio.wait_for(self._loop.create_connection(lambda: client, uri.host, uri.port), 30)
                    await asyncio.wait_for(opened, 30)
                except Exception as exc:  # noqa: BLE001 - counted, and the test fails on it
                    self.failed.append(f"client {index}: {type(exc).__name__}: {exc}")
                    return
            self.clients.append(client)

        await asyncio.gather(*(one(i) for i in range(self.count)))

    def wait(self, done: Callable[[LiveClient], bool], *, timeout: float) -> float | None:
        """Until `done` holds for every client (or one was closed); the seconds it took, None
        when it did not within `timeout`."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if all(done(c) for c in list(self.clients)) or any(c.closed for c in self.clients):
                return time.monotonic() - started
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        self.stopping = True

        def close_all() -> None:
            for client in self.clients:
                if client.transport is not None:
                    client.transport.abort()
            self._loop.stop()

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(close_all)
            self._thread.join(timeout=30)
        self._loop.close()


@dataclass
class Deliveries:
    """Per version published after the moment checked: how the clients came to know of it."""

    got: dict[int, int] = field(default_factory=dict)  # sent that version
    skipped: dict[int, int] = field(default_factory=dict)  # a later version said it followed an older one
    after_notice: dict[int, int] = field(default_factory=dict)  # a later whole board, after an unavailable notice
    gaps: dict[int, int] = field(default_factory=dict)  # a later message did not follow (a problem too)

    def line(self, versions: list[int], clients: int) -> str:
        return "; ".join(f"v{v}: {self.got.get(v, 0)}/{clients} sent it, {self.skipped.get(v, 0)} told it was skipped, "
                         f"{self.after_notice.get(v, 0)} after an unavailable notice, {self.gaps.get(v, 0)} by a gap"
                         for v in versions)


def deliveries_check(clients: LiveClients, versions: list[int], last: int,
                     standings: Callable[[int], Standings]) -> tuple[list[str], Deliveries]:
    """What each client was sent, against the ledger (`standings(version)`): every board
    it showed is exactly the ledger's top 100 and player count at that version (and a
    subscribed player's entry and neighbours), the versions it accepted only grow, each
    of `versions` reached it or a later message told it that it missed it (a previous
    version older than it, or a whole board after an "unavailable" notice), no message
    claimed to follow a version the client never got (a gap it had to find itself), and
    it ends showing `last`. (The problems, and how each version came.)"""
    problems: list[str] = list(clients.failed)
    boards: dict[int, Standings] = {}
    checked: dict[tuple[int, int], bool] = {}

    def board(version: int) -> Standings:
        if version not in boards:
            boards[version] = standings(version)
        return boards[version]

    deliveries = Deliveries()
    for index, client in enumerate(clients.clients):
        if client.closed:
            problems.append(f"client {index}: {client.closed}")
        # A snapshot may repeat the version the client holds (one it asked for after a gap).
        seen = [r.version for r in client.received if r.version is not None and not r.ignored]
        pushed = [r.version for r in client.received if r.version is not None and r.kind == "version" and not r.ignored]
        if any(b < a for a, b in zip(seen, seen[1:], strict=False)) or any(
                b <= a for a, b in zip(pushed, pushed[1:], strict=False)):
            problems.append(f"client {index}: versions not increasing: {seen}")
        for r in client.received:
            if r.ignored and r.kind == "version":
                problems.append(f"client {index}: sent v{r.version} after v{r.held} (not above)")
            if r.gap:
                # The server's account of what it sent this socket differs from what came:
                # it skipped something silently (the client found out, and asked anew).
                problems.append(f"client {index}: v{r.version} follows v{r.previous} by the server's account, "
                                f"v{r.held} by the client's")
            if r.board is None or r.version is None:
                continue
            expected = board(r.version)
            key = (r.board, r.version)
            if key not in checked:
                checked[key] = orjson.loads(clients.tops[r.board]) == [answer_entry(e) for e in expected.top(100)]
            if not checked[key]:
                problems.append(f"client {index}: the top shown at v{r.version} is not the ledger's")
            if r.total != len(expected):
                problems.append(f"client {index}: v{r.version} says {r.total} players, the ledger {len(expected)}")
            if client.player_id is not None and r.player is not None:
                me = expected.entry(client.player_id)
                around = [answer_entry(e) for e in expected.neighbors(client.player_id, clients.radius)]
                if r.player.get("entry") != (answer_entry(me) if me else None) or (
                        me is not None and r.player.get("neighbors") != around):
                    problems.append(f"client {index}: {client.player_id} at v{r.version} is not the ledger's")
        if client.held != last or client.top is None:
            problems.append(f"client {index}: ends on v{client.held} (board {'shown' if client.top else 'hidden'}), "
                            f"not v{last}")
        for version in versions:
            if version in seen:
                deliveries.got[version] = deliveries.got.get(version, 0) + 1
                continue
            later = next((i for i, r in enumerate(client.received)
                          if r.version is not None and r.version > version and not r.ignored), None)
            if later is None:
                problems.append(f"client {index}: v{version} never reached it, nor anything after it")
                continue
            message = client.received[later]
            notice = any(r.kind == "unavailable" for r in client.received[:later]
                         if r.at >= _last_before(client.received[:later], version))
            if message.gap:
                deliveries.gaps[version] = deliveries.gaps.get(version, 0) + 1
            elif notice and message.full:
                deliveries.after_notice[version] = deliveries.after_notice.get(version, 0) + 1
            elif message.previous is not None and message.previous < version:
                deliveries.skipped[version] = deliveries.skipped.get(version, 0) + 1
            else:
                problems.append(f"client {index}: v{version} skipped silently ({message})")
    return problems, deliveries


def _last_before(received: list[Received], version: int) -> float:
    """When the client last accepted a version below `version` (0: never)."""
    return max((r.at for r in received if r.version is not None and r.version < version and not r.ignored),
               default=0.0)
