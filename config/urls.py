from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from leaderboard.api import health
from leaderboard.api.errors import api_path_unknown
from leaderboard.live import page as live_views
from seasons.staff_views import console

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("favicon.ico", console.favicon, name="favicon"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("seasons/<str:season_id>/live", live_views.season_live_page, name="season-live"),
    path("", include("leaderboard.api.urls")),
    path("staff/", include("seasons.staff_urls")),
    path("admin/", admin.site.urls),
    # Last: whatever under the API's prefixes named no operation is the API's JSON 404.
    re_path(r"^(?:v1|internal)/", api_path_unknown, name="api-unknown"),
]
