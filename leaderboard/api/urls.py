from django.urls import path

from leaderboard.api.views import ScoresApplyView

urlpatterns = [
    path("internal/v1/seasons/<str:season_id>/scores:apply", ScoresApplyView.as_view(), name="scores-apply"),
]
