"""The FINAL read API for the rewards service: answered from the database, so it works with Redis empty."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.services import staff_public_ref
from leaderboard.api import schema as api_schema
from leaderboard.api.errors import ApiError
from leaderboard.api.params import int_param, player_id_param, region_param, season_id_param, season_not_found
from leaderboard.core.partitions import Watermark
from leaderboard.core.tiebreak import reached_text
from leaderboard.ingest.selectors import player_names_get
from leaderboard.ratelimit import ReadRateThrottle
from seasons.models import FinalStanding, Season
from seasons.selectors import (
    final_candidate_approved,
    final_corrections_list,
    final_line_format,
    final_manifest_get,
    final_regional_window,
    final_standing_get,
    final_standings_window,
    season_get,
)

FINAL_PAGE_MAX = 1000
# What the public list says of a correction whose approver gave no public reason.
DEFAULT_PUBLIC_REASON = "score corrected after staff review"


def _final_season(season_id: str) -> Season:
    season = season_get(slug=season_id_param(season_id))
    if season is None:
        raise season_not_found(season_id)
    if season.final_version is None:
        raise ApiError(status_code=404, code="not_final",
                       detail=f"season {season_id!r} is {season.state}; it has no FINAL standings yet")
    return season


def _standing(row: FinalStanding, *, regional: bool, names: dict[str, tuple[str | None, str | None]]
              ) -> dict[str, Any]:
    """An entry as the hash covers it: reached_at in a first_reached season, the region and
    regional place in a season with regions (null for a player with no region); then the
    player's current name and country (not covered: names are not versioned) and the tier
    of the FINAL version (covered in a season with tiers)."""
    name, country = names.get(row.player_id, (None, None))
    out: dict[str, Any] = {"position": row.position, "rank": row.rank, "player_id": row.player_id,
                           "display_name": name, "country": country, "score": row.score}
    if row.reached_at is not None:
        out["reached_at"] = reached_text(row.reached_at)
    if regional:
        out["region"] = row.region or None
        out["regional_position"] = row.regional_position
        out["regional_rank"] = row.regional_rank
    out["tier"] = row.tier
    return out


class FinalView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes = [ReadRateThrottle]

    @extend_schema(operation_id="final_get", summary="The FINAL standings' manifest: version, content hash, totals",
                   parameters=[api_schema.SEASON_ID],
                   responses={200: api_schema.FinalSerializer, **api_schema.final_errors()})
    def get(self, request: Request, season_id: str) -> Response:
        season = _final_season(season_id)
        manifest = final_manifest_get(season=season)
        candidate = final_candidate_approved(season=season)
        assert manifest is not None
        return Response({
            "season_id": season.slug,
            "state": season.state,
            "final_version": season.final_version,
            "kind": season.board_kind.as_dict(),
            "finalized_at": season.finalized_at,
            "content_hash": manifest.content_hash,
            "hash_algorithm": final_line_format(season=season).describe(),
            "total_players": manifest.total_players,
            # Opaque staff ids: who proposed and approved is public, their names are not.
            "proposed_by": staff_public_ref(candidate.proposed_by) if candidate and candidate.proposed_by else None,
            "approved_by": staff_public_ref(candidate.decided_by) if candidate and candidate.decided_by else None,
            "manifest": {
                "version": manifest.version,
                "as_of": manifest.as_of,
                "watermark": Watermark.from_columns(manifest.watermark_txid, manifest.watermark_id,
                                                    manifest.watermark_vector).as_json(),
                "layout": manifest.layout,
                "buckets": manifest.buckets,
            },
        })


class FinalStandingsView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes = [ReadRateThrottle]

    @extend_schema(operation_id="final_standings",
                   summary="A page of the FINAL standings in position order, or of one region's in regional "
                           "position order",
                   parameters=[api_schema.SEASON_ID, api_schema.FROM_POSITION,
                               api_schema.int_query("limit", "entries to return", low=1, high=FINAL_PAGE_MAX,
                                                    default=100),
                               api_schema.FINAL_REGION],
                   responses={200: api_schema.FinalStandingsSerializer,
                              **api_schema.final_errors(not_found=api_schema.FINAL_REGION_NOT_FOUND)})
    def get(self, request: Request, season_id: str) -> Response:
        season = _final_season(season_id)
        first = int_param(request.query_params, "from_position", default=1, low=1, high=None) or 1
        limit = int_param(request.query_params, "limit", default=100, low=1, high=FINAL_PAGE_MAX) or 100
        # A FINAL approved before regional places existed has no region to page.
        region = region_param(request.query_params, regions=season.regions if season.final_regional else ())
        head: dict[str, Any] = {"season_id": season.slug, "final_version": season.final_version,
                                "kind": season.board_kind.as_dict()}
        if region is None:
            rows = final_standings_window(season=season, from_position=first, limit=limit)
        else:
            # from_position counts in the region: pages go on by regional position.
            rows = final_regional_window(season=season, region=region, from_position=first, limit=limit)
            head["region"] = region
        regional = season.final_regional
        rows = list(rows)
        names = player_names_get(player_ids=[row.player_id for row in rows])
        entries = [_standing(row, regional=regional, names=names) for row in rows]
        return Response({**head, "from_position": first, "entries": entries})


class FinalPlayerView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes = [ReadRateThrottle]

    @extend_schema(operation_id="final_player", summary="A player's FINAL standing",
                   parameters=[api_schema.SEASON_ID, api_schema.PLAYER_ID],
                   responses={200: api_schema.FinalPlayerSerializer, **api_schema.final_errors()})
    def get(self, request: Request, season_id: str, player_id: str) -> Response:
        player_id_param(player_id)
        season = _final_season(season_id)
        row = final_standing_get(season=season, player_id=player_id)
        if row is None:
            raise ApiError(status_code=404, code="not_in_final",
                           detail=f"player {player_id!r} has no entry in the FINAL standings")
        return Response({"season_id": season.slug, "final_version": season.final_version,
                         "kind": season.board_kind.as_dict(),
                         **_standing(row, regional=season.final_regional,
                                     names=player_names_get(player_ids=[player_id]))})


class FinalCorrectionsView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes = [ReadRateThrottle]

    @extend_schema(operation_id="final_corrections", summary="Corrections applied after the FINAL was published",
                   parameters=[api_schema.SEASON_ID],
                   responses={200: api_schema.FinalCorrectionsSerializer, **api_schema.final_errors()})
    def get(self, request: Request, season_id: str) -> Response:
        season = _final_season(season_id)
        return Response({
            "season_id": season.slug,
            "final_version": season.final_version,
            "corrections": [
                {"player_id": c.player_id, "before": c.score_before, "after": c.score_after,
                 "event_id": c.event_id, "version": c.pending_version,
                 "who": c.actor_ref or "staff", "why": c.public_reason or DEFAULT_PUBLIC_REASON,
                 "at": c.created_at}
                for c in final_corrections_list(season=season)
            ],
        })
