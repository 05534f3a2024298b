"""Websocket routes (config.asgi mounts them behind the origin check)."""

from __future__ import annotations

from django.urls import path

from leaderboard.live.consumers import LiveBoardConsumer

websocket_urlpatterns = [
    path("ws/v1/seasons/<str:season_id>/live", LiveBoardConsumer.as_asgi(), name="season-live-socket"),
]
