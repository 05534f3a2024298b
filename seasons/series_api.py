"""The series API (docs/api.md, Recurring seasons): a series' windows, and results filed
in the window that holds them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from leaderboard.api import schema as api_schema
from leaderboard.api.auth import ApiClientTokenAuthentication, scope_required
from leaderboard.api.errors import ApiError, validation_error
from leaderboard.api.params import int_param
from leaderboard.api.views import payload_too_large, request_body
from leaderboard.core.events import MAX_BATCH, BatchTooLarge, EventValidationError, events_parse, id_is_valid
from leaderboard.core.season_options import MODES
from leaderboard.ratelimit import ReadRateThrottle
from seasons.models import Season, Series
from seasons.series.selectors import series_current, series_get, series_windows
from seasons.series.services import series_events_apply

SERIES_PAGE_MAX = 100
SERIES_ID = OpenApiParameter("series_id", str, OpenApiParameter.PATH, description="the series' id")


class SeriesWindowSerializer(serializers.Serializer[Any]):
    season_id = serializers.CharField(help_text="the window's season: every season read works on it")
    window = serializers.IntegerField(help_text="1 for the window starting at the anchor, then 2, 3, ...")
    starts_at = serializers.DateTimeField()
    cutoff = serializers.DateTimeField(help_text="the next window's start")
    state = serializers.CharField(help_text="SCHEDULED, OPEN, CLOSING, FINALIZING or FINAL")


class SeriesCurrentSerializer(serializers.Serializer[Any]):
    season_id = serializers.CharField()
    window = serializers.IntegerField()
    starts_at = serializers.DateTimeField()
    cutoff = serializers.DateTimeField()


class SeriesSerializer(serializers.Serializer[Any]):
    series_id = serializers.CharField()
    name = serializers.CharField()
    every = serializers.ChoiceField(choices=["1d", "7d", "1mo"])
    anchor = serializers.DateTimeField(help_text="when window 1 starts")
    approval = serializers.ChoiceField(choices=["two-person", "auto"])
    mode = serializers.ChoiceField(choices=MODES)
    kind = api_schema.KindSerializer(help_text="every window's kind")
    current = SeriesCurrentSerializer(allow_null=True, help_text="the window the clock is in, null before the anchor")
    seasons = SeriesWindowSerializer(many=True, help_text="newest window first")
    next_before = serializers.CharField(allow_null=True, help_text="`before` for the next page, null on the last")


class SeriesOutcomeSerializer(api_schema.OutcomeSerializer):
    season_id = serializers.CharField(help_text="the window season the event was filed in")


class SeriesApplyResultSerializer(serializers.Serializer[Any]):
    results = SeriesOutcomeSerializer(many=True, help_text="one per event, in order")
    leaderboard_versions = serializers.DictField(child=serializers.IntegerField(),
                                                 help_text="each window season written: its published version")
    kind = api_schema.KindSerializer(help_text="every window's kind, which decided the outcomes")


def _series(series_id: str) -> Series:
    series = series_get(slug=series_id)
    if series is None:
        raise ApiError(status_code=404, code="series_not_found", detail=f"no series {series_id!r}")
    return series


def _window(season: Season) -> dict[str, Any]:
    return {"season_id": season.slug, "window": season.series_window, "starts_at": season.starts_at.isoformat(),
            "cutoff": season.cutoff.isoformat(), "state": season.state}


class SeriesView(APIView):
    """GET /v1/series/{series_id}"""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes = [ReadRateThrottle]

    @extend_schema(
        operation_id="series_get", summary="A series of recurring seasons and its windows, newest first",
        parameters=[SERIES_ID,
                    OpenApiParameter("limit", int, description=f"windows per page, 1..{SERIES_PAGE_MAX} (default 20)"),
                    OpenApiParameter("before", str, description="a window's season_id: the page of windows before it "
                                                                "(from `next_before`)")],
        responses={200: SeriesSerializer, 400: api_schema.BAD_REQUEST, 404: api_schema.SERIES_NOT_FOUND,
                   429: api_schema.RATE_LIMITED})
    def get(self, request: Request, series_id: str) -> Response:
        series = _series(series_id)
        limit = int_param(request.query_params, "limit", default=20, low=1, high=SERIES_PAGE_MAX) or 20
        before: int | None = None
        if "before" in request.query_params:
            before_id = request.query_params["before"]
            # An id outside the id rule names no window (PostgreSQL would refuse a NUL).
            mark = (Season.objects.filter(series=series, slug=before_id).first() if id_is_valid(before_id)
                    else None)
            if mark is None:
                raise validation_error({"before": [f"must be the season_id of a window of series {series.slug!r}"]})
            before = mark.series_window
        current = series_current(series=series)
        page = series_windows(series=series, limit=limit, before=before)
        last = page[-1].series_window if page else None
        more = last is not None and last > 1
        return Response({
            "series_id": series.slug, "name": series.name, "every": series.every, "anchor": series.anchor.isoformat(),
            "approval": series.approval, "mode": series.mode,
            "kind": series.board_kind.as_dict(),
            "current": None if current is None else {k: v for k, v in _window(current).items() if k != "state"},
            "seasons": [_window(s) for s in page],
            "next_before": page[-1].slug if more else None,
        })


class SeriesScoresApplyView(APIView):
    """POST /internal/v1/series/{series_id}/scores:apply"""

    authentication_classes = [ApiClientTokenAuthentication]
    permission_classes = [scope_required("scores:write")]

    @extend_schema(operation_id="series_scores_apply",
                   summary="Apply settled match results to a series (scope scores:write)",
                   description="The body of scores:apply; each event is filed in the window whose span holds its "
                               "completed_at and answered with that window's season_id. Rules: docs/rules.md.",
                   parameters=[SERIES_ID], request={"application/json": api_schema.SCORES_APPLY_BODY},
                   responses={200: SeriesApplyResultSerializer,
                              **{**api_schema.write_errors(), 404: api_schema.SERIES_NOT_FOUND}})
    def post(self, request: Request, series_id: str) -> Response:
        series = _series(series_id)
        try:
            events = events_parse(request_body(request), mode=series.mode, max_score=series.max_score)
        except BatchTooLarge as exc:
            raise payload_too_large(f"a batch holds at most {MAX_BATCH} events, got {exc.size}") from exc
        except EventValidationError as exc:
            raise validation_error(exc.errors, write=True) from exc
        try:
            result = series_events_apply(series=series, events=events, client=request.auth)
        except EventValidationError as exc:
            raise validation_error(exc.errors, write=True) from exc
        return Response({**result.as_dict(), "kind": series.board_kind.as_dict()})
