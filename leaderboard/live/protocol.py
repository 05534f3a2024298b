"""The server's websocket protocol for live boards: uvicorn's sans-I/O implementation (its
default), with permessage-deflate negotiated without server context takeover.

    uvicorn config.asgi:application --ws leaderboard.live.protocol:LiveWebSocketProtocol

Browsers offer permessage-deflate on every socket. With uvicorn's own negotiation the
server keeps one compression context per socket, so each socket's copy of a version must
be compressed on its own: at 10,000 sockets that doubled the CPU of a publication
(docs/benchmarks.md, Websockets). Without server context takeover every message is
compressed from a fresh context, so the same text compresses to the same bytes on every
socket and the live hub compresses each distinct text once and writes those bytes to all
of them (`hub.frame_build`). What a client receives is unchanged (it decompresses a
message the same way either way); a message can compress a little less, since it cannot
refer back to the previous one. The client's own direction, and every other setting, is
uvicorn's.
"""

from __future__ import annotations

import logging
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.server import ServerProtocol


class LiveWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.config.ws_per_message_deflate:
            # uvicorn's parameters (window bits, memLevel), plus server_no_context_takeover.
            self.conn = ServerProtocol(
                extensions=[ServerPerMessageDeflateFactory(
                    server_no_context_takeover=True, server_max_window_bits=12, client_max_window_bits=12,
                    compress_settings={"memLevel": 5})],
                max_size=self.config.ws_max_size,
                logger=logging.getLogger("uvicorn.error"),
            )
