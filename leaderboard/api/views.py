from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from leaderboard.api import schema as api_schema
from leaderboard.api.auth import ApiClientTokenAuthentication, scope_required
from leaderboard.api.errors import ApiError, validation_error
from leaderboard.api.params import season_id_param, season_not_found
from leaderboard.core.events import MAX_BATCH, BatchTooLarge, EventValidationError, check_player_id, events_parse
from leaderboard.core.profiles import ProfileValidationError, friends_parse, profiles_parse
from leaderboard.ingest.services import score_events_apply
from leaderboard.profiles import player_friends_put, player_profiles_apply
from seasons.selectors import season_get


def payload_too_large(detail: str) -> ApiError:
    return ApiError(status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, code="payload_too_large", detail=detail)


def request_body(request: Request) -> Any:
    """A write's parsed JSON body, refused with a 413 over SCORES_MAX_BODY_BYTES. The ASGI
    front refuses it before reading (leaderboard/api/bodylimit.py); this holds under any
    other server too."""
    limit = settings.SCORES_MAX_BODY_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise payload_too_large(f"the body is {declared} bytes; the limit is {limit}")
    try:
        return request.data
    except RequestDataTooBig as exc:
        raise payload_too_large(f"the body exceeds {limit} bytes") from exc


class ScoresApplyView(APIView):
    """POST /internal/v1/seasons/{season_id}/scores:apply (docs/api.md, Writes)."""

    authentication_classes = [ApiClientTokenAuthentication]
    permission_classes = [scope_required("scores:write")]

    @extend_schema(operation_id="scores_apply", summary="Apply settled match results (scope scores:write)",
                   description="Each event is applied in order, in one transaction with its ledger row, and "
                               "answered with its outcome; a retried event is a `duplicate` and changes nothing. "
                               "Rules: docs/rules.md.",
                   parameters=[api_schema.SEASON_ID], request={"application/json": api_schema.SCORES_APPLY_BODY},
                   responses={200: api_schema.ApplyResultSerializer, **api_schema.write_errors()})
    def post(self, request: Request, season_id: str) -> Response:
        season = season_get(slug=season_id_param(season_id, write=True))
        if season is None:
            raise season_not_found(season_id)
        body = request_body(request)
        try:
            events = events_parse(body, mode=season.mode, max_score=season.max_score)
        except BatchTooLarge as exc:
            raise payload_too_large(f"a batch holds at most {MAX_BATCH} events, got {exc.size}") from exc
        except EventValidationError as exc:
            raise validation_error(exc.errors, write=True) from exc
        result = score_events_apply(season=season, events=events, client=request.auth)
        return Response({**result.as_dict(), "kind": season.board_kind.as_dict()})


class ProfilesApplyView(APIView):
    """POST /internal/v1/players/profiles:apply (docs/api.md, Player profiles and friends)."""

    authentication_classes = [ApiClientTokenAuthentication]
    permission_classes = [scope_required("profiles:write")]

    @extend_schema(operation_id="profiles_apply",
                   summary="Apply player profiles: regions, names and countries (scope profiles:write)",
                   description="Each profile is applied in order, in one transaction, and answered with its outcome "
                               "and the stored region and version after it; every applied or unchanged item is kept "
                               "in the player's region history. Rules: docs/rules.md.",
                   request={"application/json": api_schema.PROFILES_APPLY_BODY},
                   responses={200: api_schema.ProfilesApplyResultSerializer,
                              **api_schema.player_write_errors(), 413: api_schema.PROFILES_TOO_LARGE})
    def post(self, request: Request) -> Response:
        try:
            profiles = profiles_parse(request_body(request))
        except ProfileValidationError as exc:
            raise validation_error(exc.errors, write=True) from exc
        outcomes = player_profiles_apply(profiles=profiles, client=request.auth)
        return Response({"results": [outcome.as_dict() for outcome in outcomes]})


class FriendsPutView(APIView):
    """PUT /internal/v1/players/{player_id}/friends (docs/api.md, Player profiles and friends)."""

    authentication_classes = [ApiClientTokenAuthentication]
    permission_classes = [scope_required("social:write")]

    @extend_schema(operation_id="player_friends_put", summary="Replace a player's friend list (scope social:write)",
                   description="The whole list, with a graph_version newer than the stored one (else 409 and "
                               "nothing changes). Friends boards read it per request. Rules: docs/rules.md.",
                   parameters=[api_schema.PLAYER_WRITE_ID], request={"application/json": api_schema.FRIENDS_PUT_BODY},
                   responses={200: api_schema.FriendsPutResultSerializer, **api_schema.player_write_errors(),
                              409: api_schema.STALE_GRAPH_VERSION})
    def put(self, request: Request, player_id: str) -> Response:
        if problem := check_player_id(player_id):
            raise validation_error({"player_id": [problem]}, write=True)
        try:
            write = friends_parse(request_body(request), player_id=player_id)
        except ProfileValidationError as exc:
            raise validation_error(exc.errors, write=True) from exc
        stored = player_friends_put(player_id=player_id, friends=write.friends, graph_version=write.graph_version)
        return Response({"player_id": stored.player_id, "graph_version": stored.graph_version,
                         "friends": len(stored.friends)})
