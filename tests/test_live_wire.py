"""The fan-out's own frames (leaderboard.live.frames.frame_build, wire_write): a version's text
is framed once (compressed once, on permessage-deflate without server context takeover,
leaderboard.live.protocol) and the same bytes are written to the transport of every
socket that sends it, byte for byte what the server's websocket send writes; and the
sockets this cannot serve (uvicorn's own permessage-deflate, with a context per socket)
get the server's send as before. Through a real uvicorn (its sans-I/O websocket
implementation, the default, or live.protocol's) in this process, real clients, epochs
publishing real versions."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
import uvicorn
from asgiref.sync import async_to_sync, sync_to_async
from websockets.asyncio.client import ClientConnection, connect
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Origin

from config.asgi import application
from leaderboard.core.live import splice, top_apply
from leaderboard.live import hub as live
from leaderboard.live import redis_async
from leaderboard.live.frames import Deflate, SplicedDeflate, frame_build, text_frame, wire_of
from seasons.models import Season
from tests.support import Events, db_standings, post_ok, publish
from tests.support.reference import answer_entry

TIMEOUT = 10


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70001])
def test_a_frame_is_what_the_servers_send_writes(size: int) -> None:
    data = ("é" * size).encode()[:size]
    server = ServerProtocol()
    server.state = State.OPEN
    server.send_text(data)
    sent = b"".join(server.data_to_send())
    assert text_frame(data) == sent
    assert Frame(Opcode.TEXT, data).serialize(mask=False) == sent


def test_a_deflated_frame_is_what_the_servers_send_writes_and_the_same_for_every_socket() -> None:
    texts = [b"", b"x", orjson.dumps({"top": [{"player_id": f"p{i:06d}", "score": 1000 - i} for i in range(100)]})]
    kind = Deflate(12, (("memLevel", 5),))
    for text in texts:
        frames = []
        for _ in range(2):  # two messages on one connection, then on another: no context carried over
            server = ServerProtocol()
            server.state = State.OPEN
            deflate = PerMessageDeflate(remote_no_context_takeover=False, local_no_context_takeover=True,
                                        remote_max_window_bits=12, local_max_window_bits=12,
                                        compress_settings={"memLevel": 5})
            server.extensions = [deflate]
            server.send_text(text)
            server.send_text(text)
            frames.extend(server.data_to_send())
        assert frames == [frame_build(text, kind)] * 4
        # A client that keeps its context (as browsers do) reads it back.
        client = PerMessageDeflate(remote_no_context_takeover=True, local_no_context_takeover=False,
                                   remote_max_window_bits=12, local_max_window_bits=12)
        frame = frame_build(text, kind)
        body = frame[2:] if frame[1] < 126 else frame[4:]
        for _ in range(2):
            assert client.decode(Frame(Opcode.TEXT, body, rsv1=True)).data == text


def test_a_spliced_text_deflates_from_its_shared_part_to_the_same_text() -> None:
    kind = Deflate(12, (("memLevel", 5),))
    # A shared text long enough that zlib has written out part of it before the socket's fields.
    full = orjson.dumps({"type": "version", "top": [{"player_id": f"p{i:06d}", "rank": i} for i in range(5000)]})
    diff = orjson.dumps({"type": "version", "top_diff": {"set": []}})
    deflater = SplicedDeflate(kind, (diff.decode(), full.decode()))
    # A browser keeps its decompression context across messages: frames made from copies of
    # one compressor, one after another, must each decode alone.
    client = PerMessageDeflate(remote_no_context_takeover=True, local_no_context_takeover=False,
                               remote_max_window_bits=12, local_max_window_bits=12)
    for common in (full, diff, full):
        for player in ("p1", "p000042", "zé"):
            text = splice(common.decode(), {"previous_version": 3, "player": {"player_id": player}})
            frame = deflater.frame(text)
            assert frame[0] == 0xC1
            body = frame[2:] if frame[1] < 126 else frame[4:] if frame[1] == 126 else frame[10:]
            assert client.decode(Frame(Opcode.TEXT, body, rsv1=True), max_size=2**22).data == text.encode()
    # A text that is not spliced onto either shared text is compressed whole.
    assert deflater.frame('{"type":"other"}') == frame_build(b'{"type":"other"}', kind)


def test_commands_are_packed_alike_with_or_without_hiredis(monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[redis_async.Call] = [("ZCOUNT", "lb:{s}:b:3", "-inf", "(1234"),
                                        ("ZRANGE", "k", 0, 10, "WITHSCORES"),
                                        ("HMGET", "k", b"p\xc3\xa9", "p\u00e9"), ("GET", "")]
    packed = redis_async.resp_pack(commands)
    monkeypatch.setattr(redis_async, "_pack_command", None)
    assert redis_async.resp_pack(commands) == packed
    assert packed.startswith(b"*4\r\n$6\r\nZCOUNT\r\n$10\r\nlb:{s}:b:3\r\n")


def test_only_uvicorns_sans_io_connections_are_written_to_directly() -> None:
    async def send(message: dict[str, Any]) -> None:
        pass

    assert wire_of(send) is None  # the test communicator, another server


class Server:
    """uvicorn serving the application in the running event loop (so the test sees its hubs)."""

    def __init__(self, ws: str) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(application, ws=ws, lifespan="off", log_level="warning")
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Server:
        self.task = asyncio.ensure_future(self.server.serve(sockets=[self.sock]))
        async with asyncio.timeout(TIMEOUT):
            while not self.server.started:
                await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        assert self.task is not None
        await asyncio.wait_for(self.task, TIMEOUT)
        self.sock.close()

    def url(self, slug: str, query: str = "") -> str:
        return f"ws://127.0.0.1:{self.port}/ws/v1/seasons/{slug}/live" + (f"?{query}" if query else "")


async def receive(client: ClientConnection) -> dict[str, Any]:
    message: dict[str, Any] = orjson.loads(await asyncio.wait_for(client.recv(), TIMEOUT))
    return message


def run(body: Callable[[], Awaitable[None]]) -> None:
    async_to_sync(body)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
@pytest.mark.parametrize(("ws", "deflate_direct"), [
    # uvicorn's negotiation: a compression context per socket, so the server's send compresses.
    ("websockets-sansio", False),
    # Without server context takeover: compressed once, the same bytes to every deflate socket.
    ("leaderboard.live.protocol:LiveWebSocketProtocol", True),
])
def test_every_socket_gets_every_version_in_order_through_either_path(season: Season, post_scores: Any, ws: str,
                                                                     deflate_direct: bool) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 1000 + 10 * i) for i in range(150)])
    assert publish(season) == 1
    apost = sync_to_async(post_ok)
    apublish = sync_to_async(publish)
    origin = Origin("http://testserver")

    async def body() -> None:
        async with Server(ws) as server:
            plain = [await connect(server.url(season.slug), origin=origin, compression=None) for _ in range(3)]
            player = await connect(server.url(season.slug, "player_id=p020&radius=2"), origin=origin,
                                   compression=None)
            deflated_player = await connect(server.url(season.slug, "player_id=p020&radius=2"), origin=origin,
                                            compression="deflate")
            # permessage-deflate, as browsers offer it: every frame compressed by the server's send.
            deflated = await connect(server.url(season.slug), origin=origin, compression="deflate")
            everyone = [*plain, player, deflated, deflated_player]
            snaps = [await receive(c) for c in everyone]
            assert {s["type"] for s in snaps} == {"snapshot"}
            tops = [s["top"] for s in snaps]
            hub = live.registry().hubs[season.slug]
            for version in (2, 3, 4):
                await apost(post_scores, season, [ev.result("p020", 2000 + version), ev.result(f"n{version}", 500)])
                assert await apublish(season) == version
                standings = await sync_to_async(db_standings)(season)
                got = [await receive(c) for c in everyone]
                assert [(m["type"], m["leaderboard_version"], m["previous_version"]) for m in got] == \
                    [("version", version, version - 1)] * len(everyone)
                # The sockets without a player shared one text: the same message, whichever path.
                assert got[0] == got[1] == got[2] == got[4]
                assert got[3] == got[5]
                for index, message in enumerate(got):
                    tops[index] = top_apply(tops[index], message["top_diff"])
                    assert tops[index] == [answer_entry(e) for e in standings.top(100)]
                me = standings.entry("p020")
                assert me is not None and got[3]["player"]["entry"] == answer_entry(me)
                assert got[3]["player"]["neighbors"] == [answer_entry(e) for e in standings.neighbors("p020", 2)]
            # Three versions to four plain sockets went straight to their transports, and to
            # the deflate socket too when its messages compress alike on every socket.
            assert hub.stats.direct == 3 * (6 if deflate_direct else 4)
            assert (plain[0].protocol.extensions, deflated.protocol.extensions != []) == ([], True)
            for c in everyone:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(c.recv(), 0.2)
                await c.close()

    run(body)
