from django.contrib import admin
from django.urls import include, path

from leaderboard import live_views
from leaderboard.api import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("seasons/<str:season_id>/live", live_views.season_live_page, name="season-live"),
    path("", include("leaderboard.api.urls")),
    path("staff/", include("seasons.staff_urls")),
    path("admin/", admin.site.urls),
]
