"""Websocket routes, the origin check config.asgi mounts them behind, and the lifespan
protocol that stops the live hubs at shutdown."""

from __future__ import annotations

from typing import Any
from urllib.parse import ParseResult, urlparse

from channels.security.websocket import OriginValidator
from django.conf import settings
from django.urls import path

from leaderboard.live.consumers import LiveBoardConsumer
from leaderboard.live.hub import registry

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
    (`LiveRegistry.aclose`) before its event loop closes, so each group listener leaves
    its channel-layer group instead of staying a member (and being sent every version of
    its season) until the group's expiry, and no listener is left for the loop's close to
    cancel. A hub that does not stop within the server's own graceful-shutdown timeout is
    cancelled with the loop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await registry().aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
