"""The public read API (CONTRACT.md 3): thin views over leaderboard.selectors."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.conf import settings
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from leaderboard.api.errors import ApiError
from leaderboard.api.params import bool_param, int_param, player_id_param
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry
from leaderboard.rankview import RankReader, Unavailable, VersionExpired
from leaderboard.selectors import leaderboard_reader, player_pending_score
from seasons.selectors import season_get


def _envelope(manifest: Manifest, body: dict[str, Any]) -> dict[str, Any]:
    return {"leaderboard_version": manifest.version, "as_of": manifest.as_of, **body}


def _entries(entries: list[Entry]) -> list[dict[str, object]]:
    return [entry.as_dict() for entry in entries]


class LeaderboardReadView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    def read(self, season_id: str, call: Callable[[RankReader], Response]) -> Response:
        reader = leaderboard_reader(season_slug=season_id)
        try:
            return call(reader)
        except Unavailable:
            if season_get(slug=season_id) is None:
                raise ApiError(status_code=404, code="season_not_found", detail=f"no season {season_id!r}") from None
            retry = max(1, math.ceil(settings.EPOCH_SECONDS))
            response = Response(
                {"error": "unavailable", "retry_after": retry,
                 "detail": "no complete leaderboard version is published yet; retry shortly"},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
            )
            response["Retry-After"] = str(retry)
            return response
        except VersionExpired as exc:
            return Response(
                {"error": "version_expired", "current_version": exc.current,
                 "detail": "that version is no longer retained; reposition on the current one"},
                status=status.HTTP_410_GONE,
            )


class TopView(LeaderboardReadView):
    def get(self, request: Request, season_id: str) -> Response:
        limit = int_param(request, "limit", default=100, low=1, high=100)
        version = int_param(request, "version", default=None, low=1, high=None)

        def call(reader: RankReader) -> Response:
            manifest, top = reader.top(limit or 100, version)
            return Response(_envelope(manifest, {"entries": top, "total_players": manifest.total}))

        return self.read(season_id, call)


class WindowView(LeaderboardReadView):
    def get(self, request: Request, season_id: str) -> Response:
        first = int_param(request, "from_position", default=1, low=1, high=None)
        limit = int_param(request, "limit", default=100, low=1, high=100)
        version = int_param(request, "version", default=None, low=1, high=None)

        def call(reader: RankReader) -> Response:
            manifest, entries = reader.window(first or 1, limit or 100, version)
            return Response(_envelope(manifest, {
                "from_position": first, "entries": _entries(entries), "total_players": manifest.total,
            }))

        return self.read(season_id, call)


def _not_ranked(manifest: Manifest, player_id: str) -> Response:
    return Response(
        _envelope(manifest, {"error": "not_ranked", "player_id": player_id,
                             "detail": "this version has no entry for the player"}),
        status=status.HTTP_404_NOT_FOUND,
    )


class RankView(LeaderboardReadView):
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        player_id_param(player_id)
        version = int_param(request, "version", default=None, low=1, high=None)
        include_pending = bool_param(request, "include_pending")

        def call(reader: RankReader) -> Response:
            view = reader.rank(player_id, version)
            pending = None
            if include_pending:
                pending = player_pending_score(season_slug=season_id, player_id=player_id, published=view.entry,
                                               version=view.manifest.version)
            if view.entry is None and pending is None:
                return _not_ranked(view.manifest, player_id)
            body: dict[str, Any] = {"player_id": player_id, "total_players": view.total}
            if view.entry is not None:
                body.update(score=view.entry.score, rank=view.entry.rank, position=view.entry.position)
            else:
                body.update(score=None, rank=None, position=None)
            if include_pending:
                body["pending"] = None if pending is None else {
                    "score": pending.score, "score_version": pending.score_version,
                    "pending_version": pending.pending_version,
                }
            return Response(_envelope(view.manifest, body))

        return self.read(season_id, call)


class NeighborsView(LeaderboardReadView):
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        player_id_param(player_id)
        radius = int_param(request, "radius", default=10, low=0, high=10)
        version = int_param(request, "version", default=None, low=1, high=None)

        def call(reader: RankReader) -> Response:
            manifest, me, entries = reader.neighbors(player_id, radius or 0, version)
            if me is None:
                return _not_ranked(manifest, player_id)
            return Response(_envelope(manifest, {
                "player": me.as_dict(), "radius": radius, "entries": _entries(entries),
                "total_players": manifest.total,
            }))

        return self.read(season_id, call)
