"""A benchmark baseline, not part of the public API: rank from ONE plain Redis sorted set.

What a team would otherwise build: every player in one sorted set, member player_id and
score its score, answered with ZSCORE + ZREVRANK + ZCARD in one pipelined round trip.
It is served by the same stack as the real rank endpoint (the fast read path of
fastpath.py in the ASGI server, else a DRF view; the orjson renderer, the same
player-id validation) so bench/reads.py compares the read paths, not the servers.
It is not exact by the contract: ZREVRANK is a position with ties ordered by
member descending, and it reports it as the rank too (no shared ranks, no versions).

Routed only when settings.BENCH_BASELINE is true (leaderboard/api/urls.py); the key is
f"{REDIS_KEY_PREFIX}:baseline:{season_id}", loaded by bench/reads.py.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from leaderboard.api.params import player_id_param
from leaderboard.api.reads import Answer
from leaderboard.redis_client import redis_get
from leaderboard.views.rankview import Rider, round_trip_with


def baseline_key(season_id: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:baseline:{season_id}"


def baseline_answer(*, season_id: str, player_id: str, lean: bool = False, rider: Rider | None = None) -> Answer:
    """`lean`: the same three commands through rankview.round_trip, the client path of our
    own rank read, instead of a redis-py pipeline (bench/reads.py measures both), with the
    read limit's `rider` in the same round trip as our reads carry it."""
    player_id_param(player_id)
    key = baseline_key(season_id)
    if lean:
        score, index, total = round_trip_with(
            redis_get(), [("ZSCORE", key, player_id), ("ZREVRANK", key, player_id), ("ZCARD", key)], rider)
    else:
        with redis_get().pipeline(transaction=False) as pipe:
            pipe.zscore(key, player_id)
            pipe.zrevrank(key, player_id)
            pipe.zcard(key)
            score, index, total = pipe.execute()
    if score is None or index is None:
        return Answer(404, {"error": "not_ranked", "player_id": player_id,
                            "detail": "the baseline set has no entry for the player"})
    position = int(index) + 1
    return Answer(200, {"player_id": player_id, "total_players": int(total), "score": int(float(score)),
                        "rank": position, "position": position})


class BaselineRankView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(exclude=True)  # a benchmark's yardstick, not part of the API
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        answer = baseline_answer(season_id=season_id, player_id=player_id,
                                 lean=request.query_params.get("client") == "lean")
        return Response(answer.body, status=answer.status)
