"""Websocket routes, the origin check config.asgi mounts them behind, and the lifespan
protocol that stops the live hubs at shutdown."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import ParseResult, urlparse

from channels.security.websocket import OriginValidator
from django.conf import settings
from django.urls import path

from leaderboard.live.consumers import LiveBoardConsumer
from leaderboard.live.hub import TASK_STOP_RETRY_SECONDS, registry

log = logging.getLogger(__name__)

# How long shutdown waits for the hubs: a stopper's second cancellation comes
# TASK_STOP_RETRY_SECONDS after its first, and a listener's group_discard fits in that.
LIFESPAN_STOP_SECONDS = 2 * TASK_STOP_RETRY_SECONDS

websocket_urlpatterns = [
    path("ws/v1/seasons/<str:season_id>/live", LiveBoardConsumer.as_asgi(), name="season-live-socket"),
]


def _origin(scope: dict[str, Any]) -> ParseResult | None:
    """The handshake's Origin, parsed (the last one when there are several, as channels')."""
    origin = None
    for name, value in scope.get("headers", []):
        if name == b"origin":
            origin = urlparse(value.decode("latin1"))
    return origin


class OriginChecked(OriginValidator):  # type: ignore[misc]
    """Channels' origin check (the Origin header must name one of the allowed hosts; a
    client without one is refused), whose refusal holds nothing once it is sent.

    Channels refuses with a consumer that takes a channel of the channel layer, closes the
    handshake, then waits for the client's disconnect with a receive polling Redis, and
    cancels that receive on the way out, a cancellation redis-py can lose on Python 3.11
    (`hub.tasks_stop`): the receive then polls for ever. Here the handshake is answered
    with a close (the server sends HTTP 403) and the application returns.
    """

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not self.valid_origin(_origin(scope)):
            message = await receive()
            if message["type"] == "websocket.connect":
                await send({"type": "websocket.close"})
            return None
        return await super().__call__(scope, receive, send)


def origin_checked(application: Any) -> OriginChecked:
    """`application` behind the origin check, allowing ALLOWED_HOSTS (and the local
    addresses in DEBUG when that is empty), as channels' AllowedHostsOriginValidator."""
    allowed_hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    return OriginChecked(application, allowed_hosts)


async def lifespan(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI lifespan protocol: at shutdown the worker stops its live hubs
    (`LiveRegistry.aclose`) before its event loop closes. The server sends the shutdown
    after it closed the sockets, whose hubs are then already stopping: this waits for
    their listeners to leave their channel-layer groups (else each stays a member, and is
    sent every version of its season, until the group's expiry) and for the hubs of any
    socket still open. Bounded (LIFESPAN_STOP_SECONDS): uvicorn waits for the answer
    without a limit, and a worker that never answers would hold its whole server."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            try:
                async with asyncio.timeout(LIFESPAN_STOP_SECONDS):
                    await registry().aclose()
            except Exception as exc:  # the loop closes anyway: the server logs why
                log.exception("live hubs not stopped at shutdown")
                await send({"type": "lifespan.shutdown.failed", "message": f"live hubs not stopped: {exc!r}"})
                return
            await send({"type": "lifespan.shutdown.complete"})
            return
