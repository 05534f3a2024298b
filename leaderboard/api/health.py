from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from leaderboard.metrics import metrics_render
from leaderboard.redis_client import redis_get


# The probes answer GET and HEAD; any other method is a 405 with Allow, as on the API's URLs
# (CSRF-exempt: they change nothing, and the CSRF check would answer an unknown method 403).
@csrf_exempt
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up; says nothing of its dependencies."""
    return JsonResponse({"status": "ok"})


@csrf_exempt
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """Ready to serve: the database and Redis both answer."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"error: {exc.__class__.__name__}"
    try:
        redis_get().ping()
        checks["redis"] = "ok"
    except Exception as exc:  # noqa: BLE001
        checks["redis"] = f"error: {exc.__class__.__name__}"
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503)


@csrf_exempt
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition; scrape it from inside the deployment's network."""
    return HttpResponse(metrics_render(), content_type="text/plain; version=0.0.4; charset=utf-8")
