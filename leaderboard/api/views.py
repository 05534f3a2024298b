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
from leaderboard.core.events import MAX_BATCH, BatchTooLarge, EventValidationError, events_parse
from leaderboard.services import score_events_apply
from seasons.selectors import season_get


def _too_large(detail: str) -> ApiError:
    return ApiError(status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, code="payload_too_large", detail=detail)


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
        limit = settings.SCORES_MAX_BODY_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise _too_large(f"the body is {declared} bytes; the limit is {limit}")
        try:
            body: Any = request.data
        except RequestDataTooBig as exc:
            raise _too_large(f"the body exceeds {limit} bytes") from exc
        try:
            events = events_parse(body)
        except BatchTooLarge as exc:
            raise _too_large(f"a batch holds at most {MAX_BATCH} events, got {exc.size}") from exc
        except EventValidationError as exc:
            raise validation_error(exc.errors, write=True) from exc
        result = score_events_apply(season=season, events=events, client=request.auth)
        return Response(result.as_dict())
