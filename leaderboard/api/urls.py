from django.conf import settings
from django.urls import path

from leaderboard.api import read_views
from leaderboard.api.history import PlayerHistoryView
from leaderboard.api.views import FriendsPutView, ProfilesApplyView, ScoresApplyView
from seasons import api as final_api
from seasons.disputes_api import DisputesView
from seasons.series_api import SeriesScoresApplyView, SeriesView

urlpatterns = [
    # The writes take their ids with <path:>: an id with an encoded '/' reaches the view,
    # which refuses it naming the field (a 400), as any id outside the id rule.
    path("internal/v1/seasons/<path:season_id>/scores:apply", ScoresApplyView.as_view(), name="scores-apply"),
    path("internal/v1/seasons/<path:season_id>/disputes", DisputesView.as_view(), name="disputes-file"),
    path("internal/v1/series/<path:series_id>/scores:apply", SeriesScoresApplyView.as_view(),
         name="series-scores-apply"),
    path("v1/series/<str:series_id>", SeriesView.as_view(), name="series"),
    path("internal/v1/players/profiles:apply", ProfilesApplyView.as_view(), name="profiles-apply"),
    path("internal/v1/players/<path:player_id>/friends", FriendsPutView.as_view(), name="player-friends-put"),
    path("v1/seasons/<str:season_id>/leaderboard/top", read_views.TopView.as_view(), name="leaderboard-top"),
    path("v1/seasons/<str:season_id>/leaderboard", read_views.WindowView.as_view(), name="leaderboard-window"),
    path("v1/seasons/<str:season_id>/players/<str:player_id>/rank", read_views.RankView.as_view(), name="player-rank"),
    path("v1/seasons/<str:season_id>/players/<str:player_id>/history", PlayerHistoryView.as_view(),
         name="player-history"),
    path("v1/seasons/<str:season_id>/players/<str:player_id>/neighbors", read_views.NeighborsView.as_view(),
         name="player-neighbors"),
    path("v1/seasons/<str:season_id>/players/<str:player_id>/friends", read_views.FriendsView.as_view(),
         name="player-friends"),
    path("v1/seasons/<str:season_id>/regions/<str:region>/leaderboard/top", read_views.RegionalTopView.as_view(),
         name="region-leaderboard-top"),
    path("v1/seasons/<str:season_id>/regions/<str:region>/leaderboard", read_views.RegionalWindowView.as_view(),
         name="region-leaderboard-window"),
    path("v1/seasons/<str:season_id>/regions/<str:region>/players/<str:player_id>/rank",
         read_views.RegionalRankView.as_view(), name="region-player-rank"),
    path("v1/seasons/<str:season_id>/regions/<str:region>/players/<str:player_id>/neighbors",
         read_views.RegionalNeighborsView.as_view(), name="region-player-neighbors"),
    path("v1/seasons/<str:season_id>/final", final_api.FinalView.as_view(), name="final"),
    path("v1/seasons/<str:season_id>/final/standings", final_api.FinalStandingsView.as_view(), name="final-standings"),
    path("v1/seasons/<str:season_id>/final/players/<str:player_id>", final_api.FinalPlayerView.as_view(),
         name="final-player"),
    path("v1/seasons/<str:season_id>/final/corrections", final_api.FinalCorrectionsView.as_view(),
         name="final-corrections"),
]

if settings.BENCH_BASELINE:
    from leaderboard.api.baseline_views import BaselineRankView

    urlpatterns.append(path("bench/baseline/seasons/<str:season_id>/players/<str:player_id>/rank",
                            BaselineRankView.as_view(), name="bench-baseline-rank"))
