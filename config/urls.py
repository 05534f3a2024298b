from django.contrib import admin
from django.urls import include, path

from leaderboard.api import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", include("leaderboard.api.urls")),
    path("admin/", admin.site.urls),
]
