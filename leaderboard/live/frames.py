"""How the fan-out's messages get onto the sockets' connections without a per-socket cost.

Frames: a round's text is framed once (compressed once on permessage-deflate without
server context takeover, live.protocol; a player socket's own fields spliced onto the
shared compressed part) and the same bytes are written to the transport of every
connection that sends it (`wire_of`, `frame_kind`, `wire_write`), byte for byte what the
server's send would write. Sends: every other socket gets the ASGI send, run in the
caller's task until it first has to wait (`send_started`). Apart from the hub because it
depends on the wire (RFC 6455 and 7692, uvicorn's and websockets' internals, checked once
per connection), not on seasons or versions: a server upgrade that changes those touches
this module only.
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any


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


def send_started(coro: Coroutine[Any, Any, None] | asyncio.Future[None]) -> Awaitable[None] | None:
    """Run a send in the caller's task until it completes or first has to wait.

    None when it completed, the usual case: the server's send writes the frame to the
    connection's buffer and returns without waiting unless the client stopped reading.
    Then the caller awaits the returned rest in a task of its own, bounded by the send
    timeout, so one stuck client holds up nothing else. The fan-out therefore costs no
    task, future or timer per socket (3.12's eager tasks, in a few lines for 3.11). What
    the send raises before it waits (the client is gone) is raised here.
    """
    if not isinstance(coro, Coroutine):
        # A server whose send hands back a future (granian's): the frame is on its way
        # already; done at once, or awaited as the rest.
        if coro.done():
            coro.result()  # what the send raised
            return None
        return coro
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
