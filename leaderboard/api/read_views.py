"""The public read API (CONTRACT.md 3) as DRF views: thin wrappers over leaderboard.api.reads.

In the ASGI server the fast read path (fastpath.py) answers these URLs before Django
sees them; these views serve every other way in (WSGI, the test client, a request the
fast path hands on) with the same functions, so the answers are the same.
"""

from __future__ import annotations

from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from leaderboard.api import reads


def _respond(answer: reads.Answer) -> Response:
    return Response(answer.body, status=answer.status, headers=answer.headers or None)


class LeaderboardReadView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]


class TopView(LeaderboardReadView):
    def get(self, request: Request, season_id: str) -> Response:
        return _respond(reads.top_answer(season_id=season_id, query=request.query_params))


class WindowView(LeaderboardReadView):
    def get(self, request: Request, season_id: str) -> Response:
        return _respond(reads.window_answer(season_id=season_id, query=request.query_params))


class RankView(LeaderboardReadView):
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        return _respond(reads.rank_answer(season_id=season_id, player_id=player_id, query=request.query_params))


class NeighborsView(LeaderboardReadView):
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        return _respond(reads.neighbors_answer(season_id=season_id, player_id=player_id,
                                               query=request.query_params))
