"""POST /internal/v1/seasons/{season_id}/disputes: a support tool files a dispute (scope disputes:write).

Body: {"player_id", "summary", "details"?, "claimed_score"?, "match_id"?, "external_ref"?}.
201 with the new dispute; 200 with the first one when `external_ref` (the tool's ticket
id) was already filed for the season, so a retried delivery never files twice.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.services import Actor
from leaderboard.api import schema as api_schema
from leaderboard.api.auth import ApiClientTokenAuthentication, scope_required
from leaderboard.api.errors import ApiError, validation_error
from leaderboard.api.params import season_id_param, season_not_found
from leaderboard.core.events import MIN_SCORE, check_int, check_player_id
from seasons.models import Dispute
from seasons.selectors import season_get
from seasons.staff.common import StaffError
from seasons.staff.disputes.services import dispute_file

SCOPE = "disputes:write"
_TEXT_LIMITS = {"summary": 200, "details": 10_000, "match_id": 64, "external_ref": 100}
_FIELDS = frozenset({"player_id", "claimed_score", *_TEXT_LIMITS})


def _parse(body: Any, *, max_score: int) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise validation_error({"body": ["must be a JSON object"]}, write=True)
    errors: dict[str, list[str]] = {}
    for name in sorted(map(str, body.keys() - _FIELDS)):
        errors[name] = ["unknown field"]
    player_id = body.get("player_id")
    if player_id is None:
        errors["player_id"] = ["this field is required"]
    elif problem := check_player_id(player_id):
        errors["player_id"] = [problem]
    out: dict[str, Any] = {"player_id": player_id}
    for name, limit in _TEXT_LIMITS.items():
        value = body.get(name, "")
        if name == "summary" and not body.get(name):
            errors[name] = ["this field is required"]
        elif not isinstance(value, str):
            errors[name] = ["must be a string"]
        elif len(value) > limit:
            errors[name] = [f"must be at most {limit} characters"]
        elif "\x00" in value:
            errors[name] = ["must not contain NUL characters"]
        out[name] = value
    score = body.get("claimed_score")
    if score is not None and (problem := check_int(score, low=MIN_SCORE, high=max_score)):
        errors["claimed_score"] = [problem]
    out["claimed_score"] = score
    if errors:
        raise validation_error(errors, write=True)
    return out


def dispute_as_dict(dispute: Dispute) -> dict[str, Any]:
    return {
        "dispute_id": dispute.pk, "season_id": dispute.season.slug, "player_id": dispute.player_id,
        "status": dispute.status, "summary": dispute.summary, "claimed_score": dispute.claimed_score,
        "match_id": dispute.match_id, "external_ref": dispute.external_ref,
        "created_at": dispute.created_at.isoformat(),
    }


class DisputesView(APIView):
    authentication_classes = [ApiClientTokenAuthentication]
    permission_classes = [scope_required(SCOPE)]

    @extend_schema(
        operation_id="dispute_file", summary="File a player's dispute (scope disputes:write)",
        description="Staff handle it in the console; a known `external_ref` answers the first dispute, so a "
                    "retried delivery never files twice.",
        parameters=[api_schema.SEASON_ID], request={"application/json": api_schema.DISPUTE_BODY},
        responses={201: OpenApiResponse(api_schema.DisputeSerializer, description="the new dispute"),
                   200: OpenApiResponse(api_schema.DisputeSerializer,
                                        description="`external_ref` was filed before: the first dispute"),
                   **api_schema.write_errors()},
    )
    def post(self, request: Request, season_id: str) -> Response:
        season = season_get(slug=season_id_param(season_id, write=True))
        if season is None:
            raise season_not_found(season_id)
        data = _parse(request.data, max_score=season.max_score)
        client = request.auth
        actor = Actor(kind="api_client", id=str(client.pk), label=client.name)
        try:
            dispute, created = dispute_file(season=season, actor=actor, source=Dispute.Source.API, **data)
        except StaffError as exc:
            raise ApiError(status_code=400, code="validation_error", detail=str(exc)) from exc
        return Response(dispute_as_dict(dispute), status=201 if created else 200)
