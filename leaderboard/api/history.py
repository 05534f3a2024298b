"""A player's daily history (docs/api.md, Movement and history): answered from the
database (the snapshots and the player's ledger rows), so it works with Redis empty."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from leaderboard.api import schema as api_schema
from leaderboard.api.params import int_param, player_id_param, season_id_param, season_not_found
from leaderboard.core.history import HISTORY_DAYS_DEFAULT, HISTORY_DAYS_MAX
from leaderboard.history.selectors import player_history_get
from leaderboard.ratelimit import ReadRateThrottle
from seasons.selectors import season_get


class PlayerHistoryView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes = [ReadRateThrottle]

    @extend_schema(operation_id="player_history", summary="A player's rank at 00:00 UTC of each of the last N days",
                   parameters=[api_schema.SEASON_ID, api_schema.PLAYER_ID, api_schema.DAYS],
                   responses={200: api_schema.HistorySerializer, **api_schema.HISTORY_ERRORS})
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        player_id_param(player_id)
        season = season_get(slug=season_id_param(season_id))
        if season is None:
            raise season_not_found(season_id)
        days = int_param(request.query_params, "days", default=HISTORY_DAYS_DEFAULT, low=1, high=HISTORY_DAYS_MAX)
        assert days is not None
        places = player_history_get(season=season, player_id=player_id, days=days, today=timezone.now().date())
        return Response({"season_id": season.slug, "player_id": player_id, "days": days,
                         "entries": [place.as_point() for place in places]})
