"""Websocket routes, and the origin check config.asgi mounts them behind."""

from __future__ import annotations

from typing import Any
from urllib.parse import ParseResult, urlparse

from channels.security.websocket import OriginValidator
from django.conf import settings
from django.urls import path

from leaderboard.live.consumers import LiveBoardConsumer

websocket_urlpatterns = [
    path("ws/v1/seasons/<str:season_id>/live", LiveBoardConsumer.as_asgi(), name="season-live-socket"),
]


def _origin(scope: dict[str, Any]) -> ParseResult | None:
    for name, value in scope.get("headers", []):
        if name == b"origin":
            try:
                return urlparse(value.decode("latin1"))
            except UnicodeDecodeError:
                return None
    return None


class OriginChecked(OriginValidator):  # type: ignore[misc]
    """Channels' origin check (the Origin header must name one of the allowed hosts; a
    client without one is refused), whose refusal holds nothing once it is sent.

    Channels refuses with a consumer that closes the handshake and then stays until the
    client goes, with a channel of the channel layer and a receive polling Redis all that
    time: every socket a foreign page opened would hold one. Here the handshake is
    answered with a close (the server sends HTTP 403) and the application returns.
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
