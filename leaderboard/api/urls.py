from django.urls import path

from leaderboard.api import read_views
from leaderboard.api.views import ScoresApplyView

urlpatterns = [
    path("internal/v1/seasons/<str:season_id>/scores:apply", ScoresApplyView.as_view(), name="scores-apply"),
    path("v1/seasons/<str:season_id>/leaderboard/top", read_views.TopView.as_view(), name="leaderboard-top"),
    path("v1/seasons/<str:season_id>/leaderboard", read_views.WindowView.as_view(), name="leaderboard-window"),
    path("v1/seasons/<str:season_id>/players/<str:player_id>/rank", read_views.RankView.as_view(), name="player-rank"),
    path("v1/seasons/<str:season_id>/players/<str:player_id>/neighbors", read_views.NeighborsView.as_view(),
         name="player-neighbors"),
]
