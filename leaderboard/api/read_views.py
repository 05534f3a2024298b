"""The public read API (docs/api.md, Reads) as DRF views: thin wrappers over leaderboard.api.reads.

In the ASGI server the fast read path (fastpath.py) answers these URLs before Django
sees them; these views serve every other way in (WSGI, the test client, a request the
fast path hands on) with the same functions, so the answers are the same.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from leaderboard.api import reads
from leaderboard.api import schema as api_schema
from leaderboard.ratelimit import ReadRateThrottle


def _respond(answer: reads.Answer) -> Response:
    return Response(answer.body, status=answer.status, headers=answer.headers or None)


class LeaderboardReadView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes = [ReadRateThrottle]


class TopView(LeaderboardReadView):
    @extend_schema(operation_id="leaderboard_top", summary="The top of the current (or a given) version",
                   parameters=[api_schema.SEASON_ID, api_schema.LIMIT, api_schema.VERSION],
                   responses={200: api_schema.TopSerializer, **api_schema.read_errors()})
    def get(self, request: Request, season_id: str) -> Response:
        return _respond(reads.top_answer(season_id=season_id, query=request.query_params))


class WindowView(LeaderboardReadView):
    @extend_schema(operation_id="leaderboard_window",
                   summary="A window of the board from any position, or the page after a cursor",
                   parameters=[api_schema.SEASON_ID, api_schema.FROM_POSITION, api_schema.LIMIT,
                               api_schema.VERSION, api_schema.AFTER],
                   responses={200: api_schema.WindowSerializer, **api_schema.read_errors()})
    def get(self, request: Request, season_id: str) -> Response:
        return _respond(reads.window_answer(season_id=season_id, query=request.query_params))


class RankView(LeaderboardReadView):
    @extend_schema(operation_id="player_rank", summary="A player's score, rank and position",
                   parameters=[api_schema.SEASON_ID, api_schema.PLAYER_ID, api_schema.VERSION,
                               api_schema.INCLUDE_PENDING],
                   responses={200: api_schema.RankSerializer, **api_schema.read_errors()})
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        return _respond(reads.rank_answer(season_id=season_id, player_id=player_id, query=request.query_params))


class NeighborsView(LeaderboardReadView):
    @extend_schema(operation_id="player_neighbors", summary="A player and the entries around them",
                   parameters=[api_schema.SEASON_ID, api_schema.PLAYER_ID, api_schema.RADIUS, api_schema.VERSION],
                   responses={200: api_schema.NeighborsSerializer, **api_schema.read_errors()})
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        return _respond(reads.neighbors_answer(season_id=season_id, player_id=player_id,
                                               query=request.query_params))


class FriendsView(LeaderboardReadView):
    @extend_schema(operation_id="player_friends", summary="A player and their friends ranked among themselves",
                   parameters=[api_schema.SEASON_ID, api_schema.PLAYER_ID, api_schema.VERSION],
                   responses={200: api_schema.FriendsSerializer, **api_schema.friends_errors()})
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        return _respond(reads.friends_answer(season_id=season_id, player_id=player_id, query=request.query_params))


# --- a region's board: the same reads, answered from that region's board of the version


class RegionalTopView(LeaderboardReadView):
    @extend_schema(operation_id="region_leaderboard_top", summary="The top of a region's board",
                   parameters=[api_schema.SEASON_ID, api_schema.REGION, api_schema.LIMIT, api_schema.VERSION],
                   responses={200: api_schema.RegionalTopSerializer, **api_schema.regional_read_errors()})
    def get(self, request: Request, season_id: str, region: str) -> Response:
        return _respond(reads.top_answer(season_id=season_id, query=request.query_params, region=region))


class RegionalWindowView(LeaderboardReadView):
    @extend_schema(operation_id="region_leaderboard_window", summary="A window of a region's board from any position",
                   parameters=[api_schema.SEASON_ID, api_schema.REGION, api_schema.FROM_POSITION, api_schema.LIMIT,
                               api_schema.VERSION, api_schema.AFTER],
                   responses={200: api_schema.RegionalWindowSerializer, **api_schema.regional_read_errors()})
    def get(self, request: Request, season_id: str, region: str) -> Response:
        return _respond(reads.window_answer(season_id=season_id, query=request.query_params, region=region))


class RegionalRankView(LeaderboardReadView):
    @extend_schema(operation_id="region_player_rank", summary="A player's score, rank and position in their region",
                   parameters=[api_schema.SEASON_ID, api_schema.REGION, api_schema.PLAYER_ID, api_schema.VERSION,
                               api_schema.INCLUDE_PENDING],
                   responses={200: api_schema.RankSerializer, **api_schema.regional_read_errors()})
    def get(self, request: Request, season_id: str, region: str, player_id: str) -> Response:
        return _respond(reads.rank_answer(season_id=season_id, player_id=player_id, query=request.query_params,
                                          region=region))


class RegionalNeighborsView(LeaderboardReadView):
    @extend_schema(operation_id="region_player_neighbors", summary="A player and the entries around them in their "
                                                                   "region",
                   parameters=[api_schema.SEASON_ID, api_schema.REGION, api_schema.PLAYER_ID, api_schema.RADIUS,
                               api_schema.VERSION],
                   responses={200: api_schema.RegionalNeighborsSerializer, **api_schema.regional_read_errors()})
    def get(self, request: Request, season_id: str, region: str, player_id: str) -> Response:
        return _respond(reads.neighbors_answer(season_id=season_id, player_id=player_id, query=request.query_params,
                                               region=region))
