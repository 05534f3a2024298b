"""The public live page of a season: /seasons/{season_id}/live (docs/api.md, Live board websocket).

A plain page; the board itself arrives over the websocket (static/live/live.js), so the
view only renders the shell with the season's identity and state.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from leaderboard.core.lifecycle import SeasonState
from leaderboard.core.live import RADIUS_DEFAULT, RADIUS_MAX
from seasons.selectors import season_get


@require_safe
def season_live_page(request: HttpRequest, season_id: str) -> HttpResponse:
    season = season_get(slug=season_id)
    if season is None:
        raise Http404("no such season")
    return render(request, "live/season.html", {
        "season": season,
        "is_final": season.state == SeasonState.FINAL.value,
        "socket_path": f"/ws/v1/seasons/{season.slug}/live",
        "radius": RADIUS_DEFAULT,
        "radius_max": RADIUS_MAX,
    })
