"""The public live page of a season: /seasons/{season_id}/live[?region=G] (docs/api.md, Live board websocket).

A plain page; the board itself arrives over the websocket (static/live/live.js), so the
view only renders the shell with the season's identity and state, and the board it
follows: the global one, or with `region` that region's (a switcher links them all).
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from leaderboard.api.errors import ApiError
from leaderboard.api.params import region_param
from leaderboard.core.lifecycle import SeasonState
from leaderboard.core.live import RADIUS_DEFAULT
from leaderboard.core.ranking import RADIUS_MAX
from seasons.selectors import season_get


@require_safe
def season_live_page(request: HttpRequest, season_id: str) -> HttpResponse:
    season = season_get(slug=season_id)
    if season is None:
        raise Http404("no such season")
    page = {
        "season": season,
        "is_final": season.state == SeasonState.FINAL.value,
        "socket_path": f"/ws/v1/seasons/{season.slug}/live",
        "regions": season.regions,
        "radius": RADIUS_DEFAULT,
        "radius_max": RADIUS_MAX,
    }
    try:
        # The read API's rule: 400 for a malformed region, 404 unknown_region for one the
        # season does not have; a person reads it on the page itself, with the boards it has.
        region = region_param(request.GET, regions=season.regions)
    except ApiError as exc:
        problems = exc.extra.get("fields", {}).get("region")
        why = f"“{request.GET.get('region', '')}” is not a region name: {problems[0]}" if problems else str(exc.detail)
        return render(request, "live/season.html", {**page, "region": None, "board_error": why},
                      status=exc.status_code)
    return render(request, "live/season.html", {**page, "region": region})
