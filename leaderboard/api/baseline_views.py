"""A benchmark baseline, not part of the public API: rank from ONE plain Redis sorted set.

What a team would otherwise build: every player in one sorted set, member player_id and
score its score, answered with ZSCORE + ZREVRANK + ZCARD in one pipelined round trip.
It serves the same stack as the real rank endpoint (Django, DRF, the orjson renderer,
the same player-id validation) so bench/reads.py compares the read paths, not the
servers. It is not exact by the contract: ZREVRANK is a position with ties ordered by
member descending, and it reports it as the rank too (no shared ranks, no versions).

Routed only when settings.BENCH_BASELINE is true (leaderboard/api/urls.py); the key is
f"{REDIS_KEY_PREFIX}:baseline:{season_id}", loaded by bench/reads.py.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from leaderboard.api.params import player_id_param
from leaderboard.redis_client import redis_get


def baseline_key(season_id: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:baseline:{season_id}"


class BaselineRankView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        player_id_param(player_id)
        key = baseline_key(season_id)
        with redis_get().pipeline(transaction=False) as pipe:
            pipe.zscore(key, player_id)
            pipe.zrevrank(key, player_id)
            pipe.zcard(key)
            score, index, total = pipe.execute()
        if score is None or index is None:
            return Response({"error": "not_ranked", "player_id": player_id,
                             "detail": "the baseline set has no entry for the player"},
                            status=status.HTTP_404_NOT_FOUND)
        position = int(index) + 1
        return Response({"player_id": player_id, "total_players": int(total), "score": int(score),
                         "rank": position, "position": position})
